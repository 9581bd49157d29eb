"""Stands in for the installed rustbpe package (tests/projects/nanochat/README.md says why)."""
