"""The degradation monitor: is the agent getting worse, and which layer should act?

Four checks over the trace store (local or Langfuse, through a
:class:`~evoharness.evolve.episodes.traces.TraceSource`) and the artifact registry:

- **quality drift**: rubric total and P0 rate per prompt/adapter version, tested with an
  always-valid sequential test (:class:`DriftDetector`), not a fixed threshold;
- **tool decay**: success rate and latency per tool over time (same test);
- **stale preference data**: DPO datasets built before the active adapter version;
- **context rot**: tools the active prompt names that are not registered, and registered
  tools it never names.

Every :class:`Finding` names the layer that should act (memory, guard, prompt, weights, ops)
and is recorded as an event of one ``evoharness.monitor`` trace in the store.

>>> from evoharness.evolve.monitor import detect
>>> detect([0.9, 0.8] * 25 + [0.4, 0.5] * 25, reference=40) is not None
True

See ``docs/monitor.md``.
"""

from evoharness.evolve.monitor.checks import (
    DriftConfig,
    ToolSample,
    activated_at,
    context_rot,
    load_manifests,
    mentioned_tools,
    quality_drift,
    stale_preference_data,
    tool_decay,
    tool_samples_of,
    version_group,
    windows,
)
from evoharness.evolve.monitor.findings import (
    INTERNAL_TAG,
    MONITOR_TAG,
    Finding,
    Layer,
    exclude_internal,
    findings_of,
    is_internal,
    read_findings,
    record_findings,
)
from evoharness.evolve.monitor.run import (
    MonitorReport,
    environment_tools,
    ops_decisions,
    prompt_texts,
    record_to_store,
    run_monitor,
)
from evoharness.evolve.monitor.sequential import Detection, DriftDetector, detect

__all__ = [
    "INTERNAL_TAG",
    "MONITOR_TAG",
    "Detection",
    "DriftConfig",
    "DriftDetector",
    "Finding",
    "Layer",
    "MonitorReport",
    "ToolSample",
    "activated_at",
    "context_rot",
    "detect",
    "environment_tools",
    "exclude_internal",
    "findings_of",
    "is_internal",
    "load_manifests",
    "mentioned_tools",
    "ops_decisions",
    "prompt_texts",
    "quality_drift",
    "read_findings",
    "record_findings",
    "record_to_store",
    "run_monitor",
    "stale_preference_data",
    "tool_decay",
    "tool_samples_of",
    "version_group",
    "windows",
]
