"""Routing rules for replicas replayed together: which engine a request goes to.

`ROUTERS` names the rules and `DEFAULT_ROUTER` is capacity's. `cluster_manager` is ODMA's
(seeds/001 §3.5: the Cluster Manager "assigns incoming batches to devices by jointly considering
compute load and memory pressure", tracking "device-local free capacity and bucket occupancy").
sim/cluster.py replays the replicas together on one clock and applies the rules
(`--router cluster-manager` for ODMA's).
"""

from __future__ import annotations

from collections.abc import Sequence

# the routers sim/cluster.py applies (its docstring says each rule), in the order of its rule
# numbers, each with the line `capacity --help` gives it
ROUTER_SUMMARIES = {
    "round-robin": "request i to engine i mod R",
    "least-outstanding": "the fewest requests",
    "least-kv": "the least KV in demand",
    "cluster-manager": "ODMA's: the most KV free, then the least load",
    "round-robin-ready": "round-robin over the engines that can start the request now",
}
ROUTERS = tuple(ROUTER_SUMMARIES)
# capacity's: the load-aware rule that needed the fewest devices over the router tables of
# docs/capacity.md ("How much the router moves the answer")
DEFAULT_ROUTER = "least-kv"


def cluster_manager(free_bytes_for_tag: Sequence[int], load: Sequence[int]) -> int:
    """The engine for a request: the most free memory for its bucket tag (the block its tag takes,
    in the pool that tag draws from), then the least load (running + waiting requests), then the
    lowest index. Where the papers are silent on how the two combine, memory comes first: an engine
    without room for the block would queue the request however idle it is."""
    if not free_bytes_for_tag or len(free_bytes_for_tag) != len(load):
        raise ValueError("one free-memory figure and one load per engine, for at least one engine")
    return min(range(len(load)), key=lambda e: (-free_bytes_for_tag[e], load[e], e))
