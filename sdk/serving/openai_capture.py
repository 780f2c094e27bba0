"""ChatOpenAI that keeps what an RL trainer needs: the exact token ids and logprobs.

vLLM returns ``prompt_token_ids`` (top level) and each choice's ``token_ids`` when a request
sets ``return_token_ids``, and per-token ``logprobs`` when it sets ``logprobs``. ChatOpenAI
drops the ids; :class:`CapturingChatOpenAI` copies them onto the reply's
``response_metadata`` as ``prompt_token_ids`` / ``completion_token_ids`` (``logprobs`` is
already there as ``{"content": [...]}``), where the trace recorder stores them on the
generation observation. GRPO can then train on exactly what was sampled (TRL #5224) instead
of re-tokenising rendered text.
"""

from __future__ import annotations

from typing import Any

from langchain_core.outputs import ChatResult
from langchain_openai import ChatOpenAI


def token_ids(response: dict[str, Any]) -> tuple[list[int] | None, list[int] | None]:
    """``(prompt_token_ids, completion_token_ids)`` of a chat completion, when present."""
    choices = response.get("choices") or [{}]
    first = choices[0] if isinstance(choices[0], dict) else {}
    prompt = response.get("prompt_token_ids") or first.get("prompt_token_ids")
    completion = first.get("token_ids")
    return (
        list(prompt) if isinstance(prompt, list) else None,
        list(completion) if isinstance(completion, list) else None,
    )


class CapturingChatOpenAI(ChatOpenAI):
    """``ChatOpenAI`` that records server token ids on ``response_metadata``.

    Ask the server for them with ``extra_body={"return_token_ids": True}`` and
    ``logprobs=True`` (what :meth:`VLLMAdapterManager.chat_model
    <evoharness.sdk.serving.vllm.VLLMAdapterManager.chat_model>` sets).
    """

    def _create_chat_result(
        self, response: Any, generation_info: dict[str, Any] | None = None
    ) -> ChatResult:
        result = super()._create_chat_result(response, generation_info)
        data = response if isinstance(response, dict) else response.model_dump()
        prompt, completion = token_ids(data)
        if result.generations:
            meta = result.generations[0].message.response_metadata
            if prompt is not None:
                meta["prompt_token_ids"] = prompt
            if completion is not None:
                meta["completion_token_ids"] = completion
        return result
