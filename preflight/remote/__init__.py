"""Run the collectors on every node: over SSH (fabric) in parallel, or on this machine."""

import logging

# paramiko's transport thread logs a traceback when a peer fails mid-handshake (it resets during
# the banner), and with no handler anywhere Python prints it on stderr, although connect() raises
# the same error, which becomes the node's one-line error. A handler of its own ends that; an
# application that configures logging still receives the records.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
