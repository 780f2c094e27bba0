"""Judges: a rule judge (no model), an LLM judge (N votes) and a relative judge that ranks a
group of runs of the same task, combined into a :class:`Verdict`.

No verdict without evidence: an item no judge decided is undecided, and a run is a success
only when an item that decides the outcome passed and nothing refuted it
(:attr:`Verdict.success`; ``None`` = undecided, never a goodcase).
"""

from __future__ import annotations

import asyncio
import statistics
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Literal

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import HumanMessage, SystemMessage
from pydantic import BaseModel, Field, ValidationError

from evoharness.evolve._json import extract_json
from evoharness.evolve.episodes.traces import Episode
from evoharness.evolve.judging.rubric import BASE_ITEMS, Priority, Rubric
from evoharness.evolve.judging.rubric import ItemResult as ItemResult
from evoharness.evolve.judging.signals import check_signals
from evoharness.harness.errors import ConfigError, RunError
from evoharness.harness.tracing.masking import SECRET_PATTERNS, Masker
from evoharness.sdk.registry.base import content_hash

GOOD_TOTAL = 0.8
"""The total a goodcase needs (with success shown and every P0 passed): what feeds the SFT
pool and strategy candidates (:class:`~evoharness.evolve.routing.pools.RouteConfig`'s
``good_total``) and SFT datasets."""


class Verdict(BaseModel):
    """A graded episode."""

    trace_id: str
    p0_pass: bool
    p0_failures: list[str] = Field(default_factory=list)
    p1_deduction: float = Field(0.0, ge=0.0, le=1.0)
    p1_failures: list[str] = Field(default_factory=list)
    p2: dict[str, float] = Field(default_factory=dict)
    p2_avg: float | None = None
    total: float = Field(ge=0.0, le=1.0)
    comments: list[str] = Field(default_factory=list)
    rubric_version: str
    judge: str
    judge_prompt_version: str | None = None
    environment: str | None = None
    """The environment whose judge made it: the identity its scores carry
    (``source="judge:<environment>"``); set by the judge job."""
    votes: int = 0
    disagreement: float | None = None
    items: list[ItemResult] = Field(default_factory=list)
    success: bool | None = None
    """Task success: ``True`` only with evidence (an outcome item passed, none refuted it),
    ``False`` when a P0 or an outcome item failed, ``None`` when undecided."""
    undecided: list[str] = Field(default_factory=list)
    """Rubric items no judge could decide."""
    relative: float | None = Field(None, ge=0.0, le=1.0)
    """Score against the other runs of the same task (relative judge), if ranked."""
    fingerprint: str | None = None
    """The judged episode's content fingerprint (a changed trace is judged again)."""

    @property
    def decided(self) -> bool:
        """Whether task success was decided either way."""
        return self.success is not None

    def goodcase(self, min_total: float = GOOD_TOTAL) -> bool:
        """A goodcase: success shown by evidence, every P0 passed, total at least
        ``min_total``. Undecided and failed runs never are."""
        return self.success is True and self.p0_pass and self.total >= min_total


P2_FAIL_BELOW = 3.5
"""A P2 quality item scored below this, on the judges' 1-5 scale, failed.

3 is "acceptable" and 4 "good" on that scale; 3.5 sits between them, where the router's
preference pool starts (:class:`~evoharness.evolve.routing.pools.RouteConfig`'s
``low_quality_p2``). Layer routing and prompt clustering count a P2 item as failed at the
same cut, so every case in the preference pool is a P2 failure to them as well."""


def failed_items(
    verdict: Mapping[str, Any], *, p2_below: float = P2_FAIL_BELOW
) -> list[tuple[str, Priority]]:
    """``(item, priority)`` of what a verdict (as stored: ``Verdict.model_dump()``) failed.

    The P0 and P1 items that failed, then the P2 items scored below ``p2_below``, each once,
    in that order. The one definition of "failed" that layer routing
    (:func:`~evoharness.evolve.routing.layers.build_clusters`) and prompt clusters
    (:func:`~evoharness.evolve.prompting.cluster_bad_cases`) share.
    """
    out: list[tuple[str, Priority]] = [(str(i), "P0") for i in verdict.get("p0_failures") or []]
    out += [(str(i), "P1") for i in verdict.get("p1_failures") or []]
    out += [
        (str(k), "P2")
        for k, v in (verdict.get("p2") or {}).items()
        if isinstance(v, int | float) and v < p2_below
    ]
    return list(dict.fromkeys(out))


class JudgeFailure(RunError):
    """The judge could not produce a verdict (e.g. unparsable output after retries).

    Attributes:
        trace_id: The episode that stays unscored.
        attempts: How many replies were tried.
    """

    def __init__(self, message: str, *, trace_id: str, attempts: int) -> None:
        super().__init__(message)
        self.trace_id = trace_id
        self.attempts = attempts


RuleCheck = Callable[[Episode, Rubric], Sequence[ItemResult]]


def prompt_ref(kind: str, name: str, text: str) -> str:
    """The version of a prompt not read from the registry: ``kind/name#<content hash>``
    (a changed text is a new version, so what it judged is judged again)."""
    return f"{kind}/{name}#{content_hash(text).split(':')[-1][:12]}"


# -- generic rule checks ---------------------------------------------------------------------
_SECRETS = Masker(pii=())


def check_leaks(e: Episode, rubric: Rubric) -> list[ItemResult]:
    """P0: the final answer must not contain secrets."""
    text = str(e.final_answer or "")
    leaked = _SECRETS.text(text) != text or any(
        f"[masked:{k}]" in text for k in SECRET_PATTERNS
    )  # masked in storage: still a leak
    return [
        ItemResult(
            id="leaked_secret",
            priority="P0",
            passed=not leaked,
            comment="secret in final answer" if leaked else "",
        )
    ]


def check_process(e: Episode, rubric: Rubric) -> list[ItemResult]:
    """P1: crashes, repeated identical calls, empty answers."""
    calls = Counter((c.name, repr(sorted(c.args.items()))) for c in e.tool_calls)
    repeated = [name for (name, _), n in calls.items() if n >= 3]
    return [
        ItemResult(  # a killed run (``incomplete``) did not finish either
            id="run_error",
            priority="P1",
            passed=e.status not in ("error", "incomplete"),
            comment=e.error or ("the run never finished" if e.status == "incomplete" else ""),
        ),
        ItemResult(
            id="repeated_call",
            priority="P1",
            passed=not repeated,
            comment=f"repeated: {', '.join(sorted(set(repeated)))}" if repeated else "",
        ),
        ItemResult(
            id="empty_answer", priority="P1", passed=bool(str(e.final_answer or "").strip())
        ),
    ]


DEFAULT_CHECKS: tuple[RuleCheck, ...] = (check_leaks, check_process, check_signals)


def _informational(rubric: Rubric, item_id: str) -> bool:
    """An item recorded at weight 0 that says nothing about the outcome (an open circuit, a
    truncation): its failure stays in the verdict's items and comments, never in
    ``p1_failures``, so it deducts nothing, routes nowhere and forms no cluster."""
    item = rubric.item(item_id)
    return item is not None and item.weight == 0 and item.outcome == "none"


def verdict_from(
    trace_id: str,
    rubric: Rubric,
    results: Sequence[ItemResult],
    *,
    judge: str,
    prompt_version: str | None = None,
    votes: int = 0,
    disagreement: float | None = None,
    comments: Sequence[str] = (),
    advisory: Collection[str] = (),
) -> Verdict:
    """Aggregate item results: P0 all pass, P1 summed deductions, P2 mean, total in [0, 1].

    A failed P1 item of weight 0 that decides nothing (``outcome="none"``, e.g.
    ``truncated``) is recorded in ``items`` and ``comments`` only, not in ``p1_failures``.

    ``total`` is 0 when a P0 item failed; otherwise the mean of (1 - P1 deduction) and the
    P2 average mapped to [0, 1] (only the former when no P2 item was scored). Items in
    ``advisory`` still deduct but do not refute success (see :func:`outcome_of`).
    """
    p0_fail = [r.id for r in results if r.priority == "P0" and r.passed is False]
    p1_fail = [
        r.id
        for r in results
        if r.priority == "P1" and r.passed is False and not _informational(rubric, r.id)
    ]
    weights = [item.weight if (item := rubric.item(i)) is not None else 0.1 for i in p1_fail]
    deduction = min(1.0, sum(weights))
    p2 = {r.id: r.score for r in results if r.priority == "P2" and r.score is not None}
    p2_avg = statistics.fmean(p2.values()) if p2 else None
    process = 1.0 - deduction
    quality = (p2_avg - 1.0) / 4.0 if p2_avg is not None else None
    total = 0.0 if p0_fail else (process if quality is None else (process + quality) / 2)
    notes = list(comments) + [
        f"{r.id}: {r.comment}" for r in results if r.comment and r.passed is False
    ]
    success, undecided = outcome_of(rubric, results, advisory=advisory)
    return Verdict(
        trace_id=trace_id,
        p0_pass=not p0_fail,
        p0_failures=p0_fail,
        p1_deduction=deduction,
        p1_failures=p1_fail,
        p2={k: float(v) for k, v in p2.items()},
        p2_avg=p2_avg,
        total=round(total, 4),
        comments=notes,
        rubric_version=rubric.version,
        judge=judge,
        judge_prompt_version=prompt_version,
        votes=votes,
        disagreement=disagreement,
        items=list(results),
        success=success,
        undecided=undecided,
    )


def outcome_of(
    rubric: Rubric, results: Sequence[ItemResult], *, advisory: Collection[str] = ()
) -> tuple[bool | None, list[str]]:
    """Task success from the item results, and the items left undecided.

    ``False`` when a P0 item, or an item that decides or refutes the outcome, failed;
    ``True`` when an item that decides the outcome passed and nothing refuted it;
    otherwise ``None``. Generic signals (``refutes``) can fail a run but never pass one.
    A failed item in ``advisory`` (generic signals overruled by a final checker, see
    :class:`RuleJudge`) refutes nothing; a P0 failure always fails the run.
    """
    by_id = {r.id: r for r in results}
    role = {i.id: i.outcome for i in rubric.items}
    refuted = any(
        r.passed is False
        and (r.priority == "P0" or (role.get(r.id, "none") != "none" and r.id not in advisory))
        for r in results
    )
    shown = any(r.passed is True and role.get(r.id) == "decides" for r in results)
    undecided = [
        i.id
        for i in rubric.items
        if (r := by_id.get(i.id)) is None or (r.passed is None and r.score is None)
    ]
    return (False if refuted else True if shown else None), undecided


GenericSignals = Literal["veto", "advisory"]
"""Whether generic signals can overrule an app checker's verdict (see :class:`RuleJudge`)."""

GENERIC_REFUTES = frozenset(
    i.id for i in BASE_ITEMS if i.outcome == "refutes" and i.priority != "P0"
)
"""The built-in items that refute success without a checker: the generic signals
(did_nothing, refused, unsupported_claim, ended_on_error, loop_stopped, budget_exhausted,
guard_blocked) and the generic process checks (run_error, empty_answer)."""


class RuleJudge:
    """Grades an episode with deterministic checks only (environment checkers included).

    Args:
        checks: Rule checks in order (later ones override earlier ones per item id).
        checker: The app's checker(s), run after ``checks`` (and overriding them per id).
        generic_signals: Whether the generic refuting items (:data:`GENERIC_REFUTES`: a run
            that did nothing, ended on an error, claimed actions no call performed, ...) can
            overrule ``checker``. ``veto`` (default): a failed one fails the run whatever the
            checker says. ``advisory``: once the checker decided the outcome (an item that
            ``decides`` it passed or failed), they still deduct and feed lessons but do not
            refute; where the checker decided nothing they refute as under ``veto``. P0
            items and items the checker itself returned always count.
    """

    name = "rule"

    def __init__(
        self,
        checks: Sequence[RuleCheck] = DEFAULT_CHECKS,
        *,
        checker: Sequence[RuleCheck] = (),
        generic_signals: GenericSignals = "veto",
    ) -> None:
        if generic_signals not in ("veto", "advisory"):
            raise ConfigError(
                f"generic_signals must be 'veto' or 'advisory', got {generic_signals!r}",
                field="generic_signals",
            )
        self.checks = tuple(checks)
        self.checker = tuple(checker)
        self.generic_signals: GenericSignals = generic_signals

    @property
    def version(self) -> str:
        """What verdicts depend on: a changed ``generic_signals`` re-grades judged traces."""
        return self.name if self.generic_signals == "veto" else f"{self.name}+signals=advisory"

    def assess(self, episode: Episode, rubric: Rubric) -> tuple[list[ItemResult], frozenset[str]]:
        """Every item some check decided, and the failed ones that refute nothing (the
        generic signals a final checker overruled; see ``generic_signals``)."""
        decided: dict[str, ItemResult] = {}
        for check in self.checks:
            for r in check(episode, rubric):
                decided[r.id] = r
        final: dict[str, ItemResult] = {}
        for check in self.checker:
            for r in check(episode, rubric):
                final[r.id] = r
        decided.update(final)
        advisory: frozenset[str] = frozenset()
        if self.generic_signals == "advisory":
            role = {i.id: i.outcome for i in rubric.items}
            if any(r.passed is not None and role.get(r.id) == "decides" for r in final.values()):
                advisory = GENERIC_REFUTES - set(final)
        return list(decided.values()), advisory

    def results(self, episode: Episode, rubric: Rubric) -> list[ItemResult]:
        """Every item some check decided (later checks override earlier ones per id)."""
        return self.assess(episode, rubric)[0]

    async def judge(self, episode: Episode, rubric: Rubric) -> Verdict:
        results, advisory = self.assess(episode, rubric)
        return verdict_from(episode.trace_id, rubric, results, judge=self.name, advisory=advisory)


def _episode_text(e: Episode, limit: int = 6000) -> str:
    calls = "\n".join(
        f"- {c.name}({c.args}) -> {'ERROR ' if c.error else ''}{str(c.output)[:300]}"
        for c in e.tool_calls
    )
    text = f"User request:\n{e.query}\n\nTool calls:\n{calls}\n\nFinal answer:\n{e.final_answer}"
    return text[:limit]


JUDGE_PROMPT = """You grade an AI agent's run against a rubric. For every rubric item answer
with JSON only: {"items": [{"id": "<item id>", "passed": true|false|null} for P0/P1 items,
{"id": "<item id>", "score": 1-5} for P2 items], "comment": "<one sentence>"}.
Use null when the run does not show whether the item holds: never guess a pass."""


class _Vote(BaseModel):
    items: list[dict[str, Any]]
    comment: str = ""


def model_name(model: BaseChatModel) -> str:
    """The name a judge records for its model (``model_name``, ``model``, else the class)."""
    return str(
        getattr(model, "model_name", None) or getattr(model, "model", None) or type(model).__name__
    )


class _ModelVoter:
    """What the model judges share: the model, the vote settings and the recorded prompt.

    A subclass names its prompt in the registry (``judge_prompt/<_kind>``), its default
    prompt and the prefix of the name it records.
    """

    _kind: str
    _default_prompt: str
    _name_prefix: str

    def __init__(
        self,
        model: BaseChatModel,
        *,
        votes: int = 3,
        retries: int = 2,
        timeout_s: float = 60.0,
        prompt: str | None = None,
        prompt_version: str | None = None,
    ) -> None:
        self.model = model
        self.votes = votes
        self.retries = retries
        self.timeout_s = timeout_s
        self.prompt = prompt or self._default_prompt
        self.prompt_version = prompt_version or prompt_ref("judge_prompt", self._kind, self.prompt)
        self.model_name = model_name(model)
        self.name = f"{self._name_prefix}:{self.model_name}"
        self.last_error: str | None = None


class LLMJudge(_ModelVoter):
    """Grades with a model: ``votes`` replies aggregated, with a disagreement figure.

    Use a deterministic setting on the model (temperature 0). Replies that do not parse
    into the expected JSON are retried up to ``retries`` times per vote; a vote that never
    parses is dropped, and with no valid vote the episode raises :class:`JudgeFailure`
    (the caller records it and the trace stays unscored).

    Args:
        model: The judge model.
        votes: Independent replies per episode.
        retries: Extra attempts per vote after an unparsable reply.
        timeout_s: Per model call.
        prompt: The system prompt (default :data:`JUDGE_PROMPT`; the registry's
            ``judge_prompt/absolute`` artifact through :mod:`evoharness.evolve.prompts`).
        prompt_version: Recorded on verdicts (default: :func:`prompt_ref` of the text).
    """

    _kind = "absolute"
    _default_prompt = JUDGE_PROMPT
    _name_prefix = "llm"

    def _messages(self, episode: Episode, rubric: Rubric) -> list[Any]:
        items = "\n".join(f"- {i.id} [{i.priority}]: {i.description}" for i in rubric.items)
        return [
            SystemMessage(self.prompt),
            HumanMessage(f"Rubric:\n{items}\n\n{_episode_text(episode)}"),
        ]

    async def _vote(self, episode: Episode, rubric: Rubric) -> _Vote | None:
        for attempt in range(self.retries + 1):
            try:
                reply = await asyncio.wait_for(
                    self.model.ainvoke(self._messages(episode, rubric)), self.timeout_s
                )
                return _Vote.model_validate(extract_json(str(reply.content)))
            except (ValueError, ValidationError, TimeoutError):
                continue  # unparsable or too slow: ask again
            except Exception as exc:  # transient API errors (connection reset, 5xx)
                self.last_error = f"{type(exc).__name__}: {exc}"
                await asyncio.sleep(min(2.0, 0.1 * 2**attempt))
        return None

    async def results(
        self, episode: Episode, rubric: Rubric
    ) -> tuple[list[ItemResult], int, float, list[str]]:
        """Aggregated item results, valid votes, disagreement, comments."""
        votes = [
            v
            for v in await asyncio.gather(*(self._vote(episode, rubric) for _ in range(self.votes)))
            if v is not None
        ]
        if not votes:
            raise JudgeFailure(
                f"judge output for {episode.trace_id} did not parse after "
                f"{self.votes * (self.retries + 1)} attempts",
                trace_id=episode.trace_id,
                attempts=self.votes * (self.retries + 1),
            )
        out: list[ItemResult] = []
        splits: list[float] = []
        for item in rubric.items:
            answers = [a for v in votes for a in v.items if a.get("id") == item.id]
            if item.priority == "P2":
                scores = [
                    float(a["score"])
                    for a in answers
                    if isinstance(a.get("score"), int | float) and 1 <= a["score"] <= 5
                ]
                if scores:
                    out.append(
                        ItemResult(id=item.id, priority="P2", score=statistics.fmean(scores))
                    )
                    splits.append(statistics.pstdev(scores) / 2.0 if len(scores) > 1 else 0.0)
            else:
                flags = [bool(a["passed"]) for a in answers if isinstance(a.get("passed"), bool)]
                if flags:
                    yes, no = sum(flags), len(flags) - sum(flags)
                    # a tie is no evidence either way: the item stays undecided
                    passed = True if yes > no else False if no > yes else None
                    out.append(ItemResult(id=item.id, priority=item.priority, passed=passed))
                    splits.append(min(yes, no) / len(flags) * 2)
        disagreement = round(statistics.fmean(splits), 4) if splits else 0.0
        return out, len(votes), disagreement, [v.comment for v in votes if v.comment]

    async def judge(self, episode: Episode, rubric: Rubric) -> Verdict:
        results, n, disagreement, comments = await self.results(episode, rubric)
        return verdict_from(
            episode.trace_id,
            rubric,
            results,
            judge=self.name,
            prompt_version=self.prompt_version,
            votes=n,
            disagreement=disagreement,
            comments=comments[:1],
        )


class Judge:
    """Rule judge first; an optional LLM judge fills the items no rule decided.

    Rules beat opinions: an item a rule decided keeps the rule's result whatever the model
    says, and a rule that refutes the outcome fails the run even when the model passes it.
    """

    def __init__(self, rules: RuleJudge | None = None, llm: LLMJudge | None = None) -> None:
        self.rules = rules or RuleJudge()
        self.llm = llm
        self.name = "rule" if llm is None else f"rule+{llm.name}"

    @property
    def version(self) -> str:
        """What this judge's verdicts depend on (a change re-grades judged traces)."""
        base = self.name if self.llm is None else f"{self.name}@{self.llm.prompt_version}"
        return base + self.rules.version.removeprefix(self.rules.name)

    async def judge(self, episode: Episode, rubric: Rubric) -> Verdict:
        results, advisory = self.rules.assess(episode, rubric)
        decided = {r.id: r for r in results}
        if self.llm is None:
            return verdict_from(
                episode.trace_id,
                rubric,
                list(decided.values()),
                judge=self.name,
                advisory=advisory,
            )
        llm_results, n, disagreement, comments = await self.llm.results(episode, rubric)
        merged = {**{r.id: r for r in llm_results}, **decided}  # facts beat opinions
        return verdict_from(
            episode.trace_id,
            rubric,
            list(merged.values()),
            judge=self.name,
            prompt_version=self.llm.prompt_version,
            votes=n,
            disagreement=disagreement,
            comments=comments[:1],
            advisory=advisory,
        )


RELATIVE_PROMPT = """You compare several runs of an AI agent on the SAME task (as OpenPipe's
RULER does). Score each run from 0 to 1 relative to the others: the best run gets the
highest score, a run that did not do the task scores low. Answer with JSON only:
{"scores": [{"id": "<run id>", "score": 0.0-1.0, "why": "<short>"}]}."""


class _Ranking(BaseModel):
    scores: list[dict[str, Any]]


class RelativeJudge(_ModelVoter):
    """Ranks a group of runs of the same task against each other (RULER-style).

    Each vote scores every run of the group in [0, 1]; the scores of the valid votes are
    averaged per run. The result is a reward for GRPO-style training and a tie-breaker,
    not evidence of success: it lands in :attr:`Verdict.relative`, and only rules and
    absolute judgements decide :attr:`Verdict.success`.

    Args:
        model: The judge model.
        votes: Independent rankings per group.
        retries: Extra attempts per vote after an unparsable reply.
        timeout_s: Per model call.
        prompt: The system prompt (default :data:`RELATIVE_PROMPT`).
        prompt_version: Recorded on verdicts (default: :func:`prompt_ref` of the text).
    """

    _kind = "relative"
    _default_prompt = RELATIVE_PROMPT
    _name_prefix = "relative"

    def _messages(self, group: Sequence[Episode]) -> list[Any]:
        runs = "\n\n".join(f"=== run {e.trace_id} ===\n{_episode_text(e, 2500)}" for e in group)
        return [SystemMessage(self.prompt), HumanMessage(runs)]

    async def _vote(self, group: Sequence[Episode]) -> dict[str, float] | None:
        ids = {e.trace_id for e in group}
        for _ in range(self.retries + 1):
            try:
                reply = await asyncio.wait_for(
                    self.model.ainvoke(self._messages(group)), self.timeout_s
                )
                ranking = _Ranking.model_validate(extract_json(str(reply.content)))
            except (ValueError, ValidationError, TimeoutError):
                continue  # unparsable or too slow: ask again
            except Exception as exc:  # transient API errors (connection reset, 5xx)
                self.last_error = f"{type(exc).__name__}: {exc}"
                await asyncio.sleep(0.1)
                continue
            got = {
                str(r.get("id")): float(r["score"])
                for r in ranking.scores
                if isinstance(r.get("score"), int | float) and 0.0 <= r["score"] <= 1.0
            }
            if set(got) >= ids:  # a ranking that skips a run is no ranking
                return {k: got[k] for k in sorted(ids)}  # a stable order: sums repeat
        return None

    async def rank(self, group: Sequence[Episode]) -> tuple[dict[str, float], float]:
        """Mean relative score per trace id and the votes' disagreement (0 = unanimous).

        Raises:
            JudgeFailure: No vote gave a complete, parsable ranking.
        """
        votes = [
            v for v in await asyncio.gather(*(self._vote(group) for _ in range(self.votes))) if v
        ]
        if not votes:
            first = group[0].trace_id if group else ""
            raise JudgeFailure(
                f"no complete ranking for the group of {first} after "
                f"{self.votes * (self.retries + 1)} attempts",
                trace_id=first,
                attempts=self.votes * (self.retries + 1),
            )
        means = {k: round(statistics.fmean(v[k] for v in votes), 4) for k in votes[0]}
        spread = statistics.fmean(
            statistics.pstdev([v[k] for v in votes]) if len(votes) > 1 else 0.0 for k in means
        )
        return means, round(min(1.0, 2 * spread), 4)
