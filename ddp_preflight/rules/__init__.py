"""The rules several layers share, below preflight, hangwatch, explain and launch and above node
and transport: a node's facts as typed data (facts/), the way each node reaches the master
(routes), the training's environment and the fix that changes it (environment, training_env),
who holds a port (ports), the collectives' workarounds (collectives), the command torchrun must
get (launch_args), where the training's Python is (python), and fixes as data (fix). Pure:
standard library, node and transport only (tests/unit/test_layers.py)."""
