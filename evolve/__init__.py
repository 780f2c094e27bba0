"""Offline jobs that grade traces and improve agents; they read traces via ``TraceSource``."""

from evoharness.evolve.traces import (
    Episode,
    EpisodeFilter,
    LangfuseTraceSource,
    LocalTraceSource,
    ToolCallRecord,
    TraceSource,
    build_episode,
)

__all__ = [
    "Episode",
    "EpisodeFilter",
    "LangfuseTraceSource",
    "LocalTraceSource",
    "ToolCallRecord",
    "TraceSource",
    "build_episode",
]
