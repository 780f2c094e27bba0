"""Routing: verdicts into pools, and per bad-case cluster the cheapest layer that can fix it.

:func:`route_all` puts each judged episode into the pools its verdict calls for (SFT,
strategy candidates, guard, replay, preference, lesson candidates, undecided);
:func:`decide_layers` walks the layers cheapest first (ops, memory, guard rule, prompt,
weights) for each cluster of failing cases and records why (:func:`record_decisions`);
:func:`replay_bad_cases` consumes the ``replay`` pool: the P1 bad cases run again with a
replay model, and the replays that pass :class:`ReplayGate` join the SFT pool.
"""

from evoharness.evolve.routing.layers import (
    DECISIONS_KIND,
    Cluster,
    LayerConfig,
    LayerDecision,
    LayerRouting,
    MemoryVersion,
    build_clusters,
    decide_for_cycle,
    decide_layers,
    memory_history,
    record_decisions,
    summarize_decisions,
)
from evoharness.evolve.routing.pools import (
    ROUTES,
    DiagnosisPackage,
    RouteConfig,
    route_all,
    routes_for,
)
from evoharness.evolve.routing.replay import (
    REPLAY_TAG,
    ReplayGate,
    ReplayOutcome,
    ReplayReport,
    format_problems,
    replay_bad_cases,
)

__all__ = [
    "DECISIONS_KIND",
    "REPLAY_TAG",
    "ROUTES",
    "Cluster",
    "DiagnosisPackage",
    "LayerConfig",
    "LayerDecision",
    "LayerRouting",
    "MemoryVersion",
    "ReplayGate",
    "ReplayOutcome",
    "ReplayReport",
    "RouteConfig",
    "build_clusters",
    "decide_for_cycle",
    "decide_layers",
    "format_problems",
    "memory_history",
    "record_decisions",
    "replay_bad_cases",
    "route_all",
    "routes_for",
    "summarize_decisions",
]
