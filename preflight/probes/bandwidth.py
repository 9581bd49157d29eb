"""The bandwidth probe (to be built): all_reduce latency and bus bandwidth between the nodes."""


def probe(cluster, nodes, options) -> dict:
    return {"skipped": "the bandwidth probe is not built yet"}
