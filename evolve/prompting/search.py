"""The search engine: GEPA (reflective prompt evolution, Pareto selection) over our runs.

:class:`HarnessGEPAAdapter` implements GEPA's adapter interface (``evaluate``,
``make_reflective_dataset`` and, for the SIMULATED reflector, ``propose_new_texts``) over
our evaluator (:func:`~evoharness.evolve.prompting.evaluation.run_item` through an
executor) and our runs' failures, rubric hints and the cluster's traces and judge comments.

The one component GEPA evolves is :data:`COMPONENT`: the rules *appended* to the active
version. Protected sections and the stable prefix are not components, so no candidate GEPA
proposes can touch them (the gates check again anyway). GEPA searches on the cluster's
train tasks; the frozen validation split is left for the paired evaluation.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from evoharness.evolve.prompting.clusters import BadCase
from evoharness.evolve.prompting.edits import append_rules
from evoharness.evolve.prompting.evaluation import EvalItem, MemoryPin, RunRecord, run_item
from evoharness.evolve.prompting.reflect import Reflector, parse_rules
from evoharness.harness.errors import ConfigError
from evoharness.sdk.prompts import PromptTemplate

__all__ = ["COMPONENT", "HarnessGEPAAdapter", "SearchResult", "SearchTask", "gepa_search"]

COMPONENT = "learned_rules"
"""The GEPA component: new rules (one per ``- `` line) appended to the active version."""


class SearchTask(BaseModel):
    """One GEPA data instance: a task of a split (a train task of the cluster)."""

    split: str
    task_id: str
    request: str = ""


@dataclass
class SearchResult:
    """What the GEPA search found.

    Attributes:
        rules: The best candidate's new rules (empty: nothing beat the active version).
        seed_score: Mean score of the active version on the search set.
        best_score: Mean score of the best candidate on the search set.
        rollouts: Task runs spent by the search.
        candidates: Every candidate GEPA kept (component text).
    """

    rules: list[str]
    seed_score: float
    best_score: float
    rollouts: int
    candidates: list[str] = field(default_factory=list)


class _Quiet:
    def log(self, message: str) -> None:
        del message


def _model_lm(model: Any) -> Any:
    """GEPA's ``LanguageModel`` (``prompt -> str``) over a LangChain chat model."""

    def call(prompt: str | list[dict[str, Any]]) -> str:
        return str(model.invoke(prompt).content)

    return call


class HarnessGEPAAdapter:
    """GEPA's adapter over our evaluator, traces and judge evidence.

    Args:
        env: Environment plugin spec.
        prompt: The prompt name.
        base: The active version's template (rules are appended to it).
        executor: Runs the rollouts (any evoharness executor).
        hints: Rubric item id -> imperative hint (``lesson_hints_of(env)``).
        cases: Task id -> a failed case of the cluster (its trace and judge comments).
        reflector: With one, GEPA's proposal step calls it (``propose_new_texts``) instead
            of a reflection LM (the SIMULATED reflector offline).
        env_options: The run side's options (same as the paired evaluation's).
        trace_db: Trace store for the search runs.
        memory: The memory snapshot the runs are served.
    """

    def __init__(
        self,
        *,
        env: str,
        prompt: str,
        base: PromptTemplate,
        executor: Any,
        hints: Mapping[str, str] | None = None,
        cases: Mapping[str, BadCase] | None = None,
        reflector: Reflector | None = None,
        env_options: dict[str, Any] | None = None,
        trace_db: str | None = None,
        memory: MemoryPin | None = None,
    ) -> None:
        self.env = env
        self.prompt = prompt
        self.base = base
        self.executor = executor
        self.hints = dict(hints or {})
        self.cases = dict(cases or {})
        self.reflector = reflector
        self.env_options = dict(env_options or {})
        self.trace_db = trace_db
        self.memory = memory
        self.rollouts = 0
        # GEPA uses the adapter's own proposer when this attribute is set.
        self.propose_new_texts: Any = self._propose if reflector is not None else None

    def template(self, candidate: Mapping[str, str]) -> PromptTemplate:
        """The template a candidate stands for: the base plus its rules."""
        return append_rules(self.base, parse_rules(candidate.get(COMPONENT, ""), max_rules=20))

    def evaluate(
        self, batch: list[SearchTask], candidate: dict[str, str], capture_traces: bool = False
    ) -> Any:
        """Run every task of ``batch`` with the candidate's prompt; scores in [0, 1]."""
        from gepa.core.adapter import EvaluationBatch

        text = self.template(candidate).render()
        tag = hashlib.sha256(text.encode()).hexdigest()[:10]
        items = [
            EvalItem(
                env=self.env,
                env_options=self.env_options,
                split=t.split,
                task_id=t.task_id,
                prompt_name=self.prompt,
                version=0,
                prompt_text=text,
                arm="candidate",
                eval_id=f"search-{tag}",
                candidate_ref=f"prompt/{self.prompt}@search-{tag}",
                trace_db=self.trace_db,
                memory=self.memory,
            )
            for t in batch
        ]
        records: list[RunRecord] = self.executor.map(run_item, items)
        self.rollouts += len(records)
        trajectories = (
            [{"task": t, "record": r} for t, r in zip(batch, records, strict=True)]
            if capture_traces
            else None
        )
        return EvaluationBatch(
            outputs=[r.model_dump() for r in records],
            scores=[float(r.score) for r in records],
            trajectories=trajectories,
        )

    def make_reflective_dataset(
        self,
        candidate: dict[str, str],
        eval_batch: Any,
        components_to_update: list[str],
    ) -> dict[str, list[dict[str, Any]]]:
        """Per component: the runs as ``Inputs``/``Generated Outputs``/``Feedback``, the
        feedback built from the checker's failed items, their hints and — for the
        cluster's tasks — the recorded trace and the judge's comments."""
        rows: list[dict[str, Any]] = []
        for traj in eval_batch.trajectories or []:
            task: SearchTask = traj["task"]
            r: RunRecord = traj["record"]
            hints = [self.hints[f] for f in r.failures if f in self.hints]
            if r.success:
                feedback = f"Succeeded (score {r.score:.2f})."
            else:
                feedback = f"Failed (score {r.score:.2f}): {', '.join(r.failures) or r.error}."
                if hints:
                    feedback += " Do instead: " + " ".join(hints)
            case = self.cases.get(task.task_id)
            row: dict[str, Any] = {
                "Inputs": {"request": task.request or task.task_id},
                "Generated Outputs": " -> ".join(case.tool_calls) if case else "",
                "Feedback": feedback,
                "hints": hints,
            }
            if case is not None and case.comments:
                row["Judge comments"] = case.comments
            rows.append(row)
        return dict.fromkeys(components_to_update, rows)

    def _propose(
        self,
        candidate: dict[str, str],
        reflective_dataset: Mapping[str, Sequence[Mapping[str, Any]]],
        components_to_update: list[str],
    ) -> dict[str, str]:
        assert self.reflector is not None
        out: dict[str, str] = {}
        for comp in components_to_update:
            current = candidate.get(comp, "")
            rules = self.reflector.reflect(
                current + "\n" + self.base.render(), reflective_dataset.get(comp, [])
            )
            lines = [ln for ln in current.splitlines() if ln.strip()]
            lines += [f"- {r}" for r in rules]
            out[comp] = "\n".join(lines)
        return out


def gepa_search(
    adapter: HarnessGEPAAdapter,
    tasks: Sequence[SearchTask],
    *,
    reflection_model: Any = None,
    max_metric_calls: int = 40,
    minibatch: int = 3,
    pareto_tasks: int = 12,
    seed: int = 0,
) -> SearchResult:
    """Search for rules with GEPA over ``tasks`` (its trainset; the first ``pareto_tasks``
    are its own valset).

    Args:
        adapter: The adapter (its ``reflector`` or ``reflection_model`` proposes).
        tasks: The search set (the cluster's tasks, train split).
        reflection_model: A LangChain chat model GEPA's default proposer asks (when the
            adapter has no reflector).
        max_metric_calls: Rollout budget of the search.
        minibatch: GEPA's reflection minibatch size.
        pareto_tasks: The first N tasks form GEPA's own valset (Pareto tracking and the
            best candidate); every task is in its trainset (reflection minibatches).
        seed: GEPA's seed.

    Raises:
        ConfigError: Neither a reflector nor a reflection model, or no tasks.
    """
    from gepa.api import optimize

    if adapter.reflector is None and reflection_model is None:
        raise ConfigError(
            "gepa_search needs a reflection model (any LangChain chat model) or a reflector "
            "on the adapter (SimulatedReflector offline)",
            field="reflection_model",
        )
    if not tasks:
        raise ConfigError("gepa_search needs at least one search task", field="tasks")
    data = list(tasks)
    result: Any = optimize(
        seed_candidate={COMPONENT: ""},
        trainset=data,
        valset=data[:pareto_tasks],
        adapter=adapter,
        reflection_lm=_model_lm(reflection_model) if adapter.reflector is None else None,
        reflection_minibatch_size=min(minibatch, len(data)),
        max_metric_calls=max_metric_calls,
        logger=_Quiet(),
        seed=seed,
        raise_on_exception=True,
        display_progress_bar=False,
        skip_perfect_score=True,
    )
    scores = list(result.val_aggregate_scores)
    best = result.best_idx
    texts = [dict(c).get(COMPONENT, "") for c in result.candidates]
    rules = parse_rules(texts[best], max_rules=20) if scores[best] > scores[0] else []
    return SearchResult(
        rules=rules,
        seed_score=scores[0],
        best_score=scores[best],
        rollouts=adapter.rollouts,
        candidates=texts,
    )
