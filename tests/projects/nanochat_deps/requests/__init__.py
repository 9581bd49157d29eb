"""Stands in for the installed requests package (tests/projects/nanochat/README.md says why)."""
