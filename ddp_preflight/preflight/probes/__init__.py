"""Probes: things preflight tries for real across the nodes (connections, collectives,
bandwidth), where facts cannot tell. Runners here collect data; checks judge it."""
