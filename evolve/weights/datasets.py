"""Build SFT, DPO and GRPO datasets from episodes, with gates, dedupe, task splits, manifest.

Episodes are read only through :class:`~evoharness.evolve.episodes.traces.TraceSource`, so the same
build works from the local trace store and from Langfuse. Whether a run succeeded is decided by
its verdict (:class:`~evoharness.evolve.judging.judge.Verdict`, e.g. from
:meth:`EvolveState.verdicts <evoharness.evolve.judging.state.EvolveState.verdicts>`) and/or the
environment's ``env_success`` score that the runner writes on every trace.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypedDict, Unpack

from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import BaseModel, Field

from evoharness.evolve.episodes.traces import Episode, EpisodeFilter, TraceSource
from evoharness.evolve.judging.jobs import group_key
from evoharness.evolve.judging.judge import Verdict
from evoharness.evolve.weights.rows import DPORow, GRPOTask, SFTRow, chat_messages
from evoharness.harness import ConfigError
from evoharness.sdk.environment import Environment
from evoharness.sdk.registry.base import content_hash

ToolsFor = Callable[[Episode], list[dict[str, Any]]]
Decision = Literal["good", "bad", "undecided"]


def tool_schemas(tools: Sequence[BaseTool]) -> list[dict[str, Any]]:
    """OpenAI-style schemas of LangChain tools (what a chat template renders)."""
    return [convert_to_openai_tool(t) for t in tools]


class Gates(BaseModel):
    """What a run must pass to become training data.

    Attributes:
        success_score: Score name that decides success (1 = success, 0 = failure) when the
            episode carries it (the runner writes ``env_success``); ``None`` to ignore.
        min_total: Judge total a goodcase needs (with a passed P0), when a verdict exists.
        require_verdict: Drop episodes without a verdict.
        max_chars: Longest conversation (characters of all messages) kept.
        min_assistant_turns: Fewest assistant turns a row needs.
        max_assistant_turns: Most assistant turns a row may have (``None``: any); keeps
            training runs as short as the tasks a small model is evaluated on.
        bad_max_total: A verdict at or below this total (or a failed P0) marks a bad run.
    """

    success_score: str | None = "env_success"
    min_total: float = Field(0.8, ge=0.0, le=1.0)
    require_verdict: bool = False
    max_chars: int = Field(60_000, ge=100)
    min_assistant_turns: int = Field(1, ge=1)
    max_assistant_turns: int | None = Field(None, ge=1)
    bad_max_total: float = Field(0.5, ge=0.0, le=1.0)


def decide(episode: Episode, verdict: Verdict | None, gates: Gates) -> Decision:
    """``good`` (a goodcase: routed to ``sft``), ``bad`` (a decided failure) or ``undecided``."""
    if episode.status != "ok" or episode.error:
        return "bad"
    votes: list[bool] = []
    if gates.success_score is not None:
        value = episode.scores.get(gates.success_score)
        if isinstance(value, int | float):
            votes.append(value >= 1.0)
    if verdict is not None:
        if verdict.goodcase() and verdict.total >= gates.min_total:
            votes.append(True)
        elif (
            not verdict.p0_pass
            or verdict.total <= gates.bad_max_total
            or getattr(verdict, "success", None) is False
        ):
            votes.append(False)
    elif gates.require_verdict:
        return "undecided"
    if not votes:
        return "undecided"
    if all(votes):
        return "good"
    return "bad" if not any(votes) else "undecided"


def _length_ok(messages: list[dict[str, Any]], gates: Gates) -> bool:
    chars = sum(len(json.dumps(m, sort_keys=True, default=str)) for m in messages)
    turns = sum(m["role"] == "assistant" for m in messages)
    most = gates.max_assistant_turns
    return (
        chars <= gates.max_chars
        and turns >= gates.min_assistant_turns
        and (most is None or turns <= most)
    )


def split_of(task: str, *, val_fraction: float, seed: int = 0) -> str:
    """Deterministic task-level split: ``train`` or ``val`` (all rows of a task together)."""
    h = int(hashlib.sha256(f"{seed}:{task}".encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "val" if h < val_fraction else "train"


class SplitInfo(BaseModel):
    """One split of a dataset in its manifest."""

    rows: int
    tasks: int
    content_hash: str
    file: str


class DatasetManifest(BaseModel):
    """What a dataset is made of, and from which traces.

    Attributes:
        kind: ``sft``, ``dpo`` or ``grpo``.
        name: Free name.
        content_hash: Hash of all splits' row hashes (identifies the data exactly).
        splits: Per-split row count, task count, hash and file name.
        trace_ids: Provenance: every trace a row came from.
        gates: The gates in force.
        dropped: Why episodes were left out (reason -> count).
        created_at: Unix time.
    """

    kind: str
    name: str
    content_hash: str
    splits: dict[str, SplitInfo]
    trace_ids: list[str]
    gates: dict[str, Any] = Field(default_factory=dict)
    dropped: dict[str, int] = Field(default_factory=dict)
    created_at: float = 0.0


class Dataset(BaseModel):
    """Rows per split plus their manifest."""

    manifest: DatasetManifest
    splits: dict[str, list[dict[str, Any]]]

    def rows(self, split: str) -> list[dict[str, Any]]:
        """TRL-format rows of one split (empty when the split has none)."""
        return self.splits.get(split, [])

    def save(self, directory: Path | str) -> Path:
        """Write ``<split>.jsonl`` files and ``manifest.json``; returns the manifest path."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        for split, rows in self.splits.items():
            with (out / f"{split}.jsonl").open("w") as fh:
                for row in rows:
                    # key order kept: chat templates render tool schemas in dict order
                    fh.write(json.dumps(row, default=str) + "\n")
        path = out / "manifest.json"
        path.write_text(self.manifest.model_dump_json(indent=2))
        return path

    @classmethod
    def load(cls, directory: Path | str) -> Dataset:
        """Read a dataset written by :meth:`save` (hashes are checked)."""
        src = Path(directory)
        manifest = DatasetManifest.model_validate_json((src / "manifest.json").read_text())
        splits: dict[str, list[dict[str, Any]]] = {}
        for split, info in manifest.splits.items():
            lines = (src / info.file).read_text().splitlines()
            splits[split] = [json.loads(line) for line in lines if line]
            if content_hash(splits[split]) != info.content_hash:
                raise ConfigError(
                    f"dataset split {split!r} in {src} does not match its manifest hash; "
                    "rebuild the dataset",
                    field="dataset",
                )
        return cls(manifest=manifest, splits=splits)


def _assemble(
    kind: str,
    name: str,
    items: Iterable[tuple[str, str, dict[str, Any], list[str]]],
    gates: Gates,
    dropped: dict[str, int],
) -> Dataset:
    """Dedupe and split ``(task, split, row, trace_ids)`` items; compute the manifest."""
    seen: set[str] = set()
    splits: dict[str, list[dict[str, Any]]] = defaultdict(list)
    tasks: dict[str, set[str]] = defaultdict(set)
    trace_ids: list[str] = []
    for task, split, row, ids in items:
        key = content_hash({k: v for k, v in row.items() if k not in ("trace_id",)})
        if key in seen:
            dropped["duplicate"] = dropped.get("duplicate", 0) + 1
            continue
        seen.add(key)
        splits[split].append(row)
        tasks[split].add(task)
        trace_ids.extend(ids)
    infos = {
        s: SplitInfo(
            rows=len(rows), tasks=len(tasks[s]), content_hash=content_hash(rows), file=f"{s}.jsonl"
        )
        for s, rows in sorted(splits.items())
    }
    overall = content_hash({s: i.content_hash for s, i in infos.items()})
    manifest = DatasetManifest(
        kind=kind,
        name=name,
        content_hash=overall,
        splits=infos,
        trace_ids=sorted(set(trace_ids)),
        gates=gates.model_dump(),
        dropped=dropped,
        created_at=time.time(),
    )
    return Dataset(manifest=manifest, splits=dict(splits))


class EpisodeRead(TypedDict, total=False):
    """What :func:`build_sft` and :func:`build_dpo` read and how they split it (all optional).

    Attributes:
        where: Which episodes to read (default: all).
        verdicts: Judge verdicts by trace id (``EvolveState.verdicts()``).
        tools: The tool schemas the runs saw (a list, or a function of the episode); traces
            record only the tool count, so the environment supplies them.
        gates: Success/length gates (default ``Gates()``).
        val_fraction: Share of *tasks* held out as ``val`` (default 0.2).
        seed: Seeds the task split (default 0).
    """

    where: EpisodeFilter | None
    verdicts: Mapping[str, Verdict] | None
    tools: ToolsFor | Sequence[dict[str, Any]] | None
    gates: Gates | None
    val_fraction: float
    seed: int


class _Reader:
    """An :class:`EpisodeRead` with its defaults, and the rows it dropped and why."""

    def __init__(self, source: TraceSource, read: EpisodeRead) -> None:
        self.source = source
        self.read = read
        self.gates = read.get("gates") or Gates()
        self.dropped: dict[str, int] = {}

    def decided(self) -> Iterator[tuple[Episode, Decision]]:
        """Each episode read, with its decision under the gates."""
        verdicts = self.read.get("verdicts") or {}
        for e in self.source.episodes(self.read.get("where")):
            yield e, decide(e, verdicts.get(e.trace_id), self.gates)

    def tools(self, e: Episode) -> list[dict[str, Any]]:
        tools = self.read.get("tools")
        if tools is None:
            return []
        if callable(tools):
            return tools(e)
        return list(tools)

    def split(self, task: str) -> str:
        return split_of(
            task, val_fraction=self.read.get("val_fraction", 0.2), seed=self.read.get("seed", 0)
        )

    def drop(self, why: str) -> None:
        self.dropped[why] = self.dropped.get(why, 0) + 1

    def assemble(
        self, kind: str, name: str, items: Iterable[tuple[str, str, dict[str, Any], list[str]]]
    ) -> Dataset:
        return _assemble(kind, name, items, self.gates, self.dropped)


def build_sft(source: TraceSource, *, name: str = "sft", **read: Unpack[EpisodeRead]) -> Dataset:
    """SFT rows (``messages`` + ``tools``) from the goodcases of ``source``.

    Args:
        source: Where episodes come from.
        name: Dataset name for the manifest.
        **read: Which episodes, their verdicts and tools, the gates and the split
            (:class:`EpisodeRead`).
    """
    r = _Reader(source, read)

    def items() -> Iterable[tuple[str, str, dict[str, Any], list[str]]]:
        for e, decision in r.decided():
            if decision != "good":
                r.drop(f"not_good:{decision}")
                continue
            messages = chat_messages(e.messages)
            if (
                not messages
                or messages[-1]["role"] != "assistant"
                or not _length_ok(messages, r.gates)
            ):
                r.drop("length_or_shape")
                continue
            task = group_key(e)
            row = SFTRow(
                messages=messages,
                tools=r.tools(e),
                task=task,
                trace_id=e.trace_id,
                prompt_token_ids=e.prompt_token_ids,
                completion_token_ids=e.completion_token_ids,
            )
            data = row.trl() | {"task": task, "trace_id": e.trace_id}
            if row.prompt_token_ids and row.completion_token_ids:
                data["prompt_token_ids"] = row.prompt_token_ids
                data["completion_token_ids"] = row.completion_token_ids
            yield task, r.split(task), data, [e.trace_id]

    return r.assemble("sft", name, items())


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Messages equal up to tool-call ids."""

    def norm(m: dict[str, Any]) -> str:
        calls = [
            (c["function"]["name"], c["function"]["arguments"]) for c in m.get("tool_calls", [])
        ]
        return json.dumps([m["role"], m["content"], calls, m.get("name")], sort_keys=True)

    return norm(a) == norm(b)


def divergence(
    good: list[dict[str, Any]], bad: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]] | None:
    """``(shared prefix, good's next assistant turn, bad's next assistant turn)``, or ``None``
    when the runs do not part at an assistant turn (e.g. a tool answered differently)."""
    k = 0
    while k < min(len(good), len(bad)) and _same(good[k], bad[k]):
        k += 1
    if k >= len(good) or k >= len(bad) or k == 0:
        return None
    if good[k]["role"] != "assistant" or bad[k]["role"] != "assistant":
        return None
    return good[:k], good[k], bad[k]


def build_dpo(
    source: TraceSource,
    *,
    max_pairs_per_task: int = 4,
    name: str = "dpo",
    **read: Unpack[EpisodeRead],
) -> Dataset:
    """Preference pairs: a good and a bad run of the same case pattern, at their divergence.

    Every bad run of a task is paired with a good run of that task (round robin); the pair's
    prompt is their shared history and chosen/rejected are the next assistant turns.
    ``read``: as :func:`build_sft`'s.
    """
    r = _Reader(source, read)
    good: dict[str, list[Episode]] = defaultdict(list)
    bad: dict[str, list[Episode]] = defaultdict(list)
    for e, decision in r.decided():
        if decision == "good":
            good[group_key(e)].append(e)
        elif decision == "bad":
            bad[group_key(e)].append(e)
        else:
            r.drop("undecided")

    def items() -> Iterable[tuple[str, str, dict[str, Any], list[str]]]:
        for task in sorted(set(good) & set(bad)):
            made = 0
            for i, b in enumerate(bad[task]):
                if made >= max_pairs_per_task:
                    break
                gd = good[task][i % len(good[task])]
                cut = divergence(chat_messages(gd.messages), chat_messages(b.messages))
                if cut is None:
                    r.drop("no_assistant_divergence")
                    continue
                prompt, chosen, rejected = cut
                row = DPORow(
                    prompt=prompt,
                    chosen=[chosen],
                    rejected=[rejected],
                    tools=r.tools(gd),
                    task=task,
                    chosen_trace_id=gd.trace_id,
                    rejected_trace_id=b.trace_id,
                )
                made += 1
                data = row.trl() | {"task": task}
                yield task, r.split(task), data, [gd.trace_id, b.trace_id]
        unpaired = len(set(good) ^ set(bad))
        if unpaired:
            r.dropped["task_without_pair"] = unpaired

    return r.assemble("dpo", name, items())


def build_grpo(
    env: Environment,
    *,
    splits: Sequence[str] = ("train",),
    limit: int | None = None,
    name: str = "grpo",
) -> Dataset:
    """GRPO task sets from a replayable environment (the reward is its checker).

    Rows keep the environment split they came from (``val`` stays ``val``).
    """
    g = Gates()

    def items() -> Iterable[tuple[str, str, dict[str, Any], list[str]]]:
        for split in splits:
            tasks = list(env.tasks(split))[: limit or None]
            for t in tasks:
                row = GRPOTask(
                    prompt=[
                        {"role": "system", "content": env.system_prompt()},
                        {"role": "user", "content": t.request},
                    ],
                    task=t.task_id,
                    split=split,
                )
                yield t.task_id, split, row.trl(), []

    return _assemble("grpo", name, items(), g, {})
