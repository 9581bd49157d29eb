"""Run the collectors on every node: over SSH (fabric) in parallel, or on this machine."""
