"""The package's public names are exported; records cross process boundaries."""

from __future__ import annotations

import pickle

import evoharness.evolve.prompting as prompting
from evoharness.evolve.prompting import EvalItem, RunRecord


def test_every_public_name_is_exported() -> None:
    for name in prompting.__all__:
        assert getattr(prompting, name) is not None
    assert {"run_prompt_layer", "check_gates", "PairedEvaluation", "gepa_search"} <= set(
        prompting.__all__
    )


def test_items_and_records_pickle() -> None:
    item = EvalItem(
        env="shop", split="val", task_id="t", prompt_name="shop", version=2, prompt_text="x",
        arm="candidate", eval_id="e", candidate_ref="prompt/shop@v2",
    )  # fmt: skip
    record = RunRecord(
        split="val", task_id="t", version=2, arm="candidate", success=True, score=1.0, p0=False
    )
    assert pickle.loads(pickle.dumps(item)) == item
    assert pickle.loads(pickle.dumps(record)) == record
