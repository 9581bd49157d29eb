"""Renderers: each turns a Report into a string. Only the CLI prints."""
