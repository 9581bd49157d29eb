"""The Textual dashboard. It renders the objects the CLI prints as JSON; it collects nothing."""
