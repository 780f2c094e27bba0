"""Keyed PII tokens: the same value under the same deployment key is stored as the same
token, so an app's checker can compare a real value with a stored one (Masker.matches)."""

from __future__ import annotations

from pathlib import Path

from langchain_core.messages import AIMessage
from langchain_core.tools import tool

from evoharness.harness.tracing import Tracer, TraceStore
from evoharness.harness.tracing.masking import Masker
from evoharness.sdk import create_evo_agent
from evoharness.sdk.testing import ScriptedChatModel


def test_tokens_are_deterministic_per_key_and_normalised() -> None:
    a, b = Masker(pii_key="key-a"), Masker(pii_key="key-b")
    one = a.text("reply to Ann@Example.com")
    assert one.startswith("reply to [email:") and "ann" not in one.lower()
    assert a.text("reply to ann@example.com ") == one + " "  # case does not matter
    assert a.text("reply to bob@example.com") != one  # another value, another token
    assert b.text("reply to ann@example.com") != one  # another key, another token
    assert a.text("call +1 (415) 555-0100") == a.text("call +1 415 555 0100")
    assert a.text("card 4111 1111 1111 1111").startswith("card [credit_card:")


def test_secrets_stay_masked_and_no_key_keeps_the_labels() -> None:
    keyed = Masker(pii_key="s3cr3t-deploy-key")
    assert keyed.text("password=hunter2") == "password=[masked:secret]"
    assert keyed({"api_key": "sk-abcdefghijklmnopqrstuvwx"}) == {"api_key": "[masked:secret]"}
    assert Masker().text("mail ann@example.com") == "mail [masked:email]"
    assert Masker()({"email": "ann@example.com"}) == {"email": "[masked:email]"}
    assert keyed({"email": "ann@example.com"}) == {"email": keyed.token("email", "ann@example.com")}
    assert "s3cr3t" not in repr(keyed) and "pii_key" not in repr(keyed)


def test_matches_compares_real_and_stored_values() -> None:
    m = Masker(pii_key="deployment")
    stored = m({"to": "ann@example.com", "body": "refund for ann@example.com"})
    assert m.matches({"to": "Ann@Example.com", "body": "refund for ann@example.com"}, stored)
    assert not m.matches({"to": "bob@example.com", "body": "refund for ann@example.com"}, stored)
    plain = Masker()
    assert plain.matches("bob@example.com", plain.text("ann@example.com"))  # only "an email"


def test_a_checker_compares_tool_arguments_stored_in_a_trace(tmp_path: Path) -> None:
    masker = Masker(pii_key="deployment")

    @tool
    def send_email(to: str, body: str) -> str:
        """Send an email."""
        return "sent"

    call = {"name": "send_email", "args": {"to": "ann@example.com", "body": "ok"}, "id": "c1"}
    store = TraceStore(tmp_path / "traces.db", masker=masker)
    agent = create_evo_agent(
        ScriptedChatModel(script=[AIMessage("", tool_calls=[{**call, "type": "tool_call"}]), "ok"]),
        [send_email],
        tracer=Tracer(store),
    )
    agent.invoke("email ann@example.com that it is ok")
    assert store.flush()
    (trace,) = store.traces()
    (obs,) = [o for o in store.observations(trace.id) if o.type == "tool"]
    stored_to = obs.input["to"] if isinstance(obs.input, dict) else obs.input
    assert "ann@example.com" not in str(obs.input)
    assert masker.matches("ann@example.com", stored_to)  # the order's email: the right person
    assert not masker.matches("bob@example.com", stored_to)
    store.close()
