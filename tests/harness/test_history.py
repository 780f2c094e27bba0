"""The incremental history fold shared by the reflect controls: it must always equal a
fold from scratch, whatever the callers do to their lists."""

from __future__ import annotations

import random
import sys
import threading
from functools import reduce
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from evoharness.harness._fold import MessageFold
from evoharness.harness._history import (
    HistoryStats,
    call_key,
    exact_args,
    history_stats,
    reply_tokens,
)
from evoharness.harness.control._loop_state import Turn, Turns


def reply(i: int, name: str = "search", **args: Any) -> AIMessage:
    return AIMessage(
        content="",
        tool_calls=[{"name": name, "args": args or {"q": i}, "id": f"c{i}", "type": "tool_call"}],
        usage_metadata={"input_tokens": i, "output_tokens": 1, "total_tokens": i + 1},
    )


def scratch(messages: list[Any]) -> HistoryStats:
    return reduce(HistoryStats.add, messages, HistoryStats())


def turn_of(messages: list[Any]) -> Turn:
    """Loop detection's statistics of ``messages``, folded from scratch."""
    return Turns(lambda turn, has_calls: None, frozenset())._sync(messages)


def session(n: int, seed: int) -> list[Any]:
    out: list[Any] = [HumanMessage(f"task {seed}")]
    rng = random.Random(seed)
    for i in range(n):
        name = rng.choice(["search", "price"])
        out.append(reply(i, name, q=rng.randint(0, 3)))
        out.append(ToolMessage("ok", tool_call_id=f"c{i}"))
    return out


def test_growth_rewrites_and_one_off_extensions_match_a_fresh_fold() -> None:
    fold = MessageFold(HistoryStats.add, HistoryStats)
    full = session(30, 1)
    steps = 0
    for k in range(1, len(full) + 1):
        prefix = full[:k]  # a new list each round, as LangGraph's reducer makes
        assert fold(prefix) == scratch(prefix)
        extra = [*prefix, reply(100 + k)]  # the drift check's one-off "history + reply"
        assert fold(extra) == scratch(extra)
        assert fold(prefix) == scratch(prefix)  # the history itself is still cached
        fresh = reply(200 + k)  # loop detection: history + a fresh reply, no list built
        assert fold.extend(prefix, fresh) == scratch([*prefix, fresh])
        assert fold.extend(prefix, fresh) == scratch([*prefix, fresh])  # asked again
        grown = [*prefix, fresh, ToolMessage("ok", tool_call_id="x")]
        assert fold(grown) == scratch(grown)  # the next round starts from the extension
        steps += 1
    rewritten = [full[0], AIMessage("summary"), *full[-4:]]  # compaction rewrote it
    assert fold(rewritten) == scratch(rewritten)
    trimmed = full[:5]
    assert fold(trimmed) == scratch(trimmed)
    assert fold([]) == HistoryStats()
    assert fold.extend([], full[1]) == scratch([full[1]])
    assert steps == len(full)


def test_interleaved_sessions_and_threads_keep_separate_entries() -> None:
    fold = MessageFold(HistoryStats.add, HistoryStats, max_histories=4)
    sessions = [session(12, s) for s in range(6)]  # more sessions than entries: evictions
    for k in range(1, 26):
        for s in sessions:
            assert fold(s[:k]) == scratch(s[:k])
    errors: list[str] = []

    def worker(seed: int) -> None:
        s = session(20, seed)
        for k in range(1, len(s) + 1):
            if fold(s[:k]) != scratch(s[:k]):
                errors.append(f"{seed}:{k}")

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(10, 16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(fold._cache) <= 4


def test_stats_count_calls_streaks_and_tokens() -> None:
    msgs = [
        HumanMessage("x"),
        reply(1, "a", q=1),
        reply(2, "a", q=1),
        AIMessage("thinking", usage_metadata=None),
        reply(3, "b", q=2),
    ]
    calls = turn_of(msgs)
    assert calls.times(call_key({"name": "a", "args": {"q": 1}, "id": "x"})) == 2
    assert (calls.last_name, calls.streak, len(calls.last_keys)) == ("b", 1, 1)
    stats = history_stats(msgs)
    assert stats.model_calls == 4
    assert stats.tokens == 2 + 3 + reply_tokens(msgs[3]) + 4
    assert reply_tokens(msgs[3]) > 0  # no reported usage: approximated, never zero
    assert history_stats(msgs[:3]) == HistoryStats(2, 5)


def test_call_key_treats_equivalent_arguments_as_one_call() -> None:
    a = call_key({"name": "t", "args": {"x": 1, "y": "z"}, "id": "1"})
    b = call_key({"name": "t", "args": {"y": "z", "x": 1}, "id": "2"})
    assert a == b and hash(a) == hash(b)
    nested = call_key({"name": "t", "args": {"f": {"b": [1, 2], "a": None}}, "id": "3"})
    assert nested == call_key({"name": "t", "args": {"f": {"a": None, "b": [1, 2]}}, "id": "4"})
    assert nested != call_key({"name": "t", "args": {"f": {"a": None, "b": [2, 1]}}, "id": "5"})
    assert a != call_key({"name": "u", "args": {"x": 1, "y": "z"}, "id": "6"})
    # whitespace, case, and JSON held in a string
    spaced = call_key({"name": "t", "args": {"q": "  Red   Kettle "}, "id": "7"})
    assert spaced == call_key({"name": "t", "args": {"q": "red kettle"}, "id": "8"})
    as_json = call_key({"name": "t", "args": {"body": '{"b": 2,  "a": [1]}'}, "id": "9"})
    assert as_json == call_key({"name": "t", "args": {"body": '{"a":[1],"b":2}'}, "id": "10"})
    assert as_json != call_key({"name": "t", "args": {"body": '{"a":[1],"b":3}'}, "id": "11"})
    assert call_key({"name": "t", "args": {"q": "{not json"}, "id": "12"})[1] == frozenset(
        {("q", "{not json")}
    )
    # distinct inputs stay distinct
    assert call_key({"name": "rm", "args": {"path": "a.txt"}, "id": "13"}) != call_key(
        {"name": "rm", "args": {"path": "b.txt"}, "id": "14"}
    )


def test_exact_args_tell_apart_what_json_tells_apart() -> None:
    def digest(args: Any) -> int:
        return exact_args({"name": "t", "args": args, "id": "1"})

    assert digest({"x": 1, "y": "z"}) == digest({"y": "z", "x": 1})  # any key order
    # 1, 1.0 and true are different JSON, so different arguments
    assert len({digest({"x": 1}), digest({"x": 1.0}), digest({"x": True})}) == 3
    assert digest({"q": "Red"}) != digest({"q": "red"})  # exact: case matters here
    assert digest({"x": None}) != digest({})
    # nested values take the JSON path, still in any key order
    assert digest({"f": {"a": [1, 2], "b": None}}) == digest({"f": {"b": None, "a": [1, 2]}})
    assert digest({"f": {"a": [1, 2]}}) != digest({"f": {"a": [2, 1]}})
    assert digest(["not", "a", "dict"]) == digest(["not", "a", "dict"])


def _random_turns(rng: random.Random, rounds: int) -> list[Any]:
    """A history with several turns, parallel calls, changing and repeating results."""
    msgs: list[Any] = [HumanMessage("task")]
    for i in range(rounds):
        if rng.random() < 0.05:
            msgs.append(HumanMessage(f"next request {i}"))
        calls = [
            {
                "name": rng.choice(["a", "b"]),
                "args": rng.choice([{"q": rng.randint(0, 2)}, {"q": " Q"}, {"q": "q "}]),
                "id": f"c{i}-{j}",
                "type": "tool_call",
            }
            for j in range(rng.choice([0, 1, 1, 1, 2]))
        ]
        msgs.append(AIMessage(content="", tool_calls=calls))
        yield_at = len(msgs)
        msgs.extend(
            ToolMessage(rng.choice(["ok", "ok", "ok", "changed"]), tool_call_id=c["id"])
            for c in calls
            if rng.random() < 0.95  # now and then a result is missing
        )
        yield msgs[:yield_at]


def test_folded_loop_verdicts_match_detect_loop_on_random_histories() -> None:
    from evoharness.harness import LoopDetectionMiddleware, detect_loop

    rng = random.Random(7)
    for same_tool in (None, 4):
        mw = LoopDetectionMiddleware(same_call=3, same_tool=same_tool)
        found = 0
        for seed in range(40):
            for i, msgs in enumerate(_random_turns(rng, 25)):
                expected = detect_loop(msgs, same_call=3, same_tool=same_tool)
                assert mw._track(msgs).newest == expected, (seed, i)
                found += expected is not None
        assert found > 50  # the histories do contain loops


def _view(turns: Turns, messages: list[Any]) -> tuple[str | None, int]:
    return turns.state(messages)


def test_replies_folded_on_trial_match_a_fresh_fold_whatever_follows() -> None:
    """A fresh reply is folded on trial. The next history may hold that reply, another one in
    its place (the reply check rewrote it), a late tool result, or nothing new, and the same
    reply may be asked about again: every view equals a fold from scratch, and the trial's
    verdict equals :func:`detect_loop` on the history with the reply."""
    from evoharness.harness import LoopDetectionMiddleware, detect_loop

    rng = random.Random(11)
    actions: dict[str, int] = {}
    for same_tool in (None, 3):
        mw = LoopDetectionMiddleware(same_call=3, same_tool=same_tool)
        turns = mw._turns

        def fresh(messages: list[Any], mw: Any = mw) -> tuple[str | None, int]:
            turn = Turns(mw._verdict, mw.poll_tools)._sync(messages)
            return turn.newest, turn.detections

        for _ in range(30):
            full = list(_random_turns(rng, 25))[-1]
            replies = [j for j, m in enumerate(full) if isinstance(m, AIMessage)]
            for j in replies:
                history, reply = full[:j], full[j]
                got = turns.reflect(history, reply)
                assert got == fresh([*history, reply])
                assert got[0] == detect_loop([*history, reply], same_call=3, same_tool=same_tool)
                action = rng.choice(["keep", "keep", "replace", "again", "ask", "late"])
                actions[action] = actions.get(action, 0) + 1
                if action == "again":
                    assert turns.reflect(history, reply) == got
                elif action == "replace":
                    other = full[rng.choice(replies)]
                    swapped = AIMessage(content="rewritten", tool_calls=other.tool_calls)
                    assert _view(turns, [*history, swapped]) == fresh([*history, swapped])
                elif action == "ask" and history:
                    assert _view(turns, history) == fresh(history)
                elif action == "late" and history:
                    late = [*history, ToolMessage("late", tool_call_id=f"c{j}-0")]
                    assert _view(turns, late) == fresh(late)
                end = next((k for k in replies if k > j), len(full))
                assert _view(turns, full[:end]) == fresh(full[:end])
    assert min(actions.values()) > 20


def test_sessions_sharing_a_first_message_across_threads_stay_exact() -> None:
    """Apps may start every session with one constant message object: the per-history state
    is then shared by key, and threads must not fold into each other's."""
    from langchain_core.messages import SystemMessage

    from evoharness.harness import LoopDetectionMiddleware

    shared = SystemMessage("you are a shop assistant")
    mw = LoopDetectionMiddleware(same_call=3)
    errors: list[str] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        history = [shared, *list(_random_turns(rng, 20))[-1]]
        for k in range(1, len(history) + 1):
            expected = Turns(mw._verdict, mw.poll_tools)._sync(history[:k])
            if mw._turns.state(history[:k]) != (expected.newest, expected.detections):
                errors.append(f"{seed}:{k}")

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(8)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == []
