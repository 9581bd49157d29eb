"""ddp-preflight: preflight, launch and hang diagnosis for multi-node PyTorch training. One import
package; its node/ subpackage is also shipped to the nodes (standard library only, Python 3.8+),
and so is this file: it imports nothing."""
