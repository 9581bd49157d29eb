"""Stands in for the installed tiktoken package (tests/projects/nanochat/README.md says why)."""
