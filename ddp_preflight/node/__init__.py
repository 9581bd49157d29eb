"""Everything that runs ON a node, and the protocol both sides speak.

Standard library only (torch, xxhash and blake3 are used where the node's training
environment has them, and only inside the modules that need them), Python 3.8 or newer: a node
needs nothing installed but its training Python.

Shipped one way: the master starts `python -c <boot.py's text>` over SSH (or locally) and writes
this package (a zip) and the program's orders on its stdin; nothing of either shows in the
process list. The same files are imported and unit-tested on the master. See boot.py."""
