"""Collectors that run ON each node, with the training environment's Python.

This package is zipped and sent over SSH, so it uses the standard library only (torch, xxhash
and blake3 are imported where present) and relative imports only. Each collector returns a
JSON-serializable dict; main.py isolates them, so one failure is a section {"error": ...}."""
