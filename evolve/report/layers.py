"""The report's layers table: the layer results file, or one computed from an app's own runs.

Layer results file (JSON)::

    {"title": "shop", "simulated": true, "note": "offline policy",
     "rows": [{"layer": "baseline", "split": "val", "success_rate": 0.41, "p0_rate": 0.12,
               "tokens_per_task": 5200, "cost_per_task": 0.0031, "simulated": true}, ...]}
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from evoharness.evolve.episodes.traces import Episode
from evoharness.sdk.registry import Registry

LAYER_ORDER = ("baseline", "+memory", "+prompt", "+SFT", "+RL")


def _layer_of(e: Episode, first_prompt: Mapping[str, int], rl: set[str]) -> str:
    """The furthest layer in force for one run (the loop's order: memory, prompt, weights)."""
    adapters = {k: v for k, v in e.artifacts.items() if k.startswith("adapter/")}
    if adapters:
        return "+RL" if any(f"{k}@{v}" in rl for k, v in adapters.items()) else "+SFT"
    version = str(e.prompt_version or "")
    if e.prompt_name and version.isdigit() and int(version) > first_prompt.get(e.prompt_name, 0):
        return "+prompt"
    if any(k.startswith("memory/") for k in e.artifacts) and e.skill_ids:
        return "+memory"
    return "baseline"


def layer_results_from_data(
    episodes: Sequence[Episode], registry: Registry | None = None
) -> dict[str, Any] | None:
    """The layers table of any app from its own traffic (``split`` ``live``): each judged
    production run counts for the furthest layer that served it (an adapter: ``+SFT``, or
    ``+RL`` for a DPO adapter; a prompt version after the first one seen: ``+prompt``;
    learned memory injected: ``+memory``; else ``baseline``), with the judge's success and
    P0 rates and tokens per run. ``None`` when no run was judged yet."""
    judged = [e for e in episodes if isinstance(e.scores.get("judge_success"), int | float)]
    if not judged:
        return None
    first: dict[str, int] = {}
    for e in judged:
        if e.prompt_name and str(e.prompt_version or "").isdigit():
            v = int(str(e.prompt_version))
            first[e.prompt_name] = min(first.get(e.prompt_name, v), v)
    rl: set[str] = set()
    if registry is not None:
        for name in registry.names("adapter"):
            for av in registry.versions("adapter", name, content=False):
                manifest = av.metadata.get("dataset_manifest") or {}
                if isinstance(manifest, dict) and manifest.get("name") == "dpo":
                    rl.add(f"adapter/{name}@{av.version}")
    by: dict[str, list[Episode]] = defaultdict(list)
    for e in judged:
        by[_layer_of(e, first, rl)].append(e)
    rows = []
    for layer in [x for x in LAYER_ORDER if x in by] + sorted(set(by) - set(LAYER_ORDER)):
        runs = by[layer]
        p0 = [e.scores.get("p0_pass") for e in runs]
        rows.append(
            {
                "layer": layer,
                "split": "live",
                "runs": len(runs),
                "success_rate": sum(float(e.scores["judge_success"]) for e in runs) / len(runs),
                "p0_rate": sum(isinstance(v, int | float) and v < 1 for v in p0) / len(runs),
                "tokens_per_task": sum(e.usage.total_tokens for e in runs) / len(runs),
            }
        )
    return {
        "title": "live traffic",
        "note": "from the app's own judged runs: each run counts for the furthest layer "
        "that served it",
        "rows": rows,
    }


def load_layer_results(path: Path | None) -> dict[str, Any] | None:
    """The layer results JSON at ``path`` (``None`` when no path or no file)."""
    if path is None or not Path(path).exists():
        return None
    data = json.loads(Path(path).read_text())
    return data if isinstance(data, dict) else {"rows": data}
