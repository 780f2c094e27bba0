"""bench context: LangChain's SummarizationMiddleware shown at its defaults (which never call
its summariser in a tool loop) and with ``trim_tokens_to_summarize=None`` (which do)."""

from __future__ import annotations


def test_summarization_rows_at_defaults_and_with_the_trim_off() -> None:
    from evoharness.evolve.benchmarks import context as bench

    lines: list[str] = []
    results = bench.run(rounds=60, budget=12_000, echo=lines.append)
    defaults = results["(b) langchain summarization"]
    trim_off = results["(b') langchain, trim=None"]
    # at its defaults it cuts history and writes a placeholder instead of summarising
    # (200 rounds at 30K: never; here once, when a human message falls in its last 4K
    # tokens); with the trim off its summariser runs on every cut
    assert defaults["compactions"] > 0 and defaults["summaries"] <= 1
    assert trim_off["summaries"] >= 5
    assert any("trim_tokens_to_summarize=None" in line for line in lines)
    assert "summarizing_baseline_billed_ratio=" in lines[-1]
