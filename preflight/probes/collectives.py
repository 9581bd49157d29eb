"""The collectives probe (to be built): try each collective over the real backend."""


def probe(cluster, nodes, options) -> dict:
    return {"skipped": "the collectives probe is not built yet"}
