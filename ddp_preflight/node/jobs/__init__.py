"""Probe jobs: node programs that measure what training will meet (torch inside)."""
