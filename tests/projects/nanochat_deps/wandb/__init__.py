"""Stands in for the installed wandb package (tests/projects/nanochat/README.md says why)."""
