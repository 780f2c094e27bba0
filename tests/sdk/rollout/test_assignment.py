from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest

from evoharness.harness import ConfigError
from evoharness.sdk.rollout import assign, bucket, pick

IDS = [f"user-{i}" for i in range(100_000)]


def test_bucketing_is_deterministic_and_salted() -> None:
    assert bucket("exp-1", "u1") == bucket("exp-1", "u1")
    assert bucket("exp-1", "u1") != bucket("exp-2", "u1")
    assert all(0.0 <= bucket("s", u) < 1.0 for u in IDS[:1000])


@pytest.mark.slow
def test_assignment_is_sticky_across_processes() -> None:
    ids = IDS[:200]
    here = [assign("exp-7", u, 0.3, [1.0, 2.0]) for u in ids]
    code = (
        "import json, sys\n"
        "from evoharness.sdk.rollout import assign\n"
        "ids = json.loads(sys.stdin.read())\n"
        "print(json.dumps([assign('exp-7', u, 0.3, [1.0, 2.0]) for u in ids]))\n"
    )
    import json

    out = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps(ids),
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "12345", "PATH": ""},  # a different str hash seed
    )
    assert json.loads(out.stdout) == here
    assert {None, 0, 1} == set(here)


def test_buckets_are_uniform_chi_square_on_100k_ids() -> None:
    stats = pytest.importorskip("scipy.stats")
    bins = 20
    counts = Counter(int(bucket("exp-uniform", u) * bins) for u in IDS)
    result = stats.chisquare([counts[i] for i in range(bins)])
    assert result.pvalue > 0.001, result
    # the exposure split at 10% is 10% within sampling error (3 sigma ~ 0.0028)
    exposed = sum(assign("exp-uniform", u, 0.1, [1.0]) is not None for u in IDS) / len(IDS)
    assert abs(exposed - 0.1) < 0.003


def test_weights_split_the_exposed_traffic() -> None:
    stats = pytest.importorskip("scipy.stats")
    arms = Counter(assign("exp-w", u, 1.0, [1.0, 3.0]) for u in IDS)
    assert set(arms) == {0, 1}
    result = stats.chisquare([arms[0], arms[1]], f_exp=[25_000, 75_000])
    assert result.pvalue > 0.001, result


def test_raising_the_traffic_keeps_exposed_units_on_their_arm() -> None:
    at10 = {u: assign("exp-s", u, 0.1, [1.0, 1.0]) for u in IDS[:20_000]}
    at30 = {u: assign("exp-s", u, 0.3, [1.0, 1.0]) for u in IDS[:20_000]}
    exposed = [u for u, a in at10.items() if a is not None]
    assert exposed and all(at30[u] == at10[u] for u in exposed)
    assert sum(a is not None for a in at30.values()) > 2.5 * len(exposed)


def test_bad_weights_are_a_config_error() -> None:
    with pytest.raises(ConfigError, match="positive"):
        pick([1.0, 0.0], 0.5)
    with pytest.raises(ConfigError):
        pick([], 0.5)
    assert pick([1.0, 1.0], 0.49) == 0
    assert pick([1.0, 1.0], 0.51) == 1
