"""Stands in for the installed yaml package (tests/projects/nanochat/README.md says why)."""
