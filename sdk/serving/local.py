"""A LangChain chat model over transformers + PEFT: tool calls, adapter hot-swap, session pins.

One base model stays in memory; LoRA adapters are loaded next to it with PEFT's
``PeftModel.load_adapter`` and switched per call with ``set_adapter`` (~10 ms on a CPU). A
:class:`SessionRouter` pins each session (LangGraph ``thread_id``) to the adapter version that
was active when the session started, so a swap never changes a conversation midway.

Tools are rendered by the tokenizer's chat template (TRL's Qwen2.5 training template for
SmolLM2); the reply's ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks
become ``AIMessage.tool_calls``, unparseable ones ``invalid_tool_calls``.

Needs the ``train`` extra (torch, transformers, peft).
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    InvalidToolCall,
    SystemMessage,
    ToolCall,
    ToolMessage,
)
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable, RunnableConfig, ensure_config
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import ConfigDict, Field

from evoharness.harness import ConfigError

BASE = "base"
"""The version name that means the base model with no adapter."""

_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


def parse_tool_calls(text: str) -> tuple[str, list[ToolCall], list[InvalidToolCall]]:
    """Split a completion into content, valid tool calls and invalid ones.

    A valid call is a ``<tool_call>`` block holding a JSON object with a string ``name`` and
    an object ``arguments`` (a JSON-encoded string of an object is accepted too).
    """
    calls: list[ToolCall] = []
    invalid: list[InvalidToolCall] = []
    for raw in _CALL.findall(text):
        call_id = f"call_{uuid.uuid4().hex[:12]}"
        try:
            data = json.loads(raw)
            if not isinstance(data, dict) or not isinstance(data.get("name"), str):
                raise ValueError("expected an object with a string 'name'")
            args = data.get("arguments", data.get("parameters", {}))
            if isinstance(args, str):
                args = json.loads(args)
            if not isinstance(args, dict):
                raise ValueError("'arguments' must be an object")
        except ValueError as exc:
            name = None
            match = re.search(r'"name"\s*:\s*"([^"]+)"', raw)
            if match:
                name = match.group(1)
            invalid.append(
                InvalidToolCall(
                    type="invalid_tool_call", name=name, args=raw, id=call_id, error=str(exc)
                )
            )
            continue
        calls.append(ToolCall(type="tool_call", name=data["name"], args=args, id=call_id))
    content = _CALL.sub("", text).strip()
    return content, calls, invalid


def to_chat(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    """LangChain messages as chat-template messages (tool calls with dict arguments)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        text = m.content if isinstance(m.content, str) else m.text
        if isinstance(m, SystemMessage):
            out.append({"role": "system", "content": text})
        elif isinstance(m, HumanMessage):
            out.append({"role": "user", "content": text})
        elif isinstance(m, AIMessage):
            item: dict[str, Any] = {"role": "assistant", "content": text}
            if m.tool_calls:
                item["tool_calls"] = [
                    {"type": "function", "function": {"name": c["name"], "arguments": c["args"]}}
                    for c in m.tool_calls
                ]
            out.append(item)
        elif isinstance(m, ToolMessage):
            out.append({"role": "tool", "name": m.name, "content": text})
        else:
            out.append({"role": "user", "content": text})
    return out


class SessionRouter:
    """Which adapter version serves which session.

    New sessions get the active version; a session keeps the version it started with until
    it is released. Thread-safe.
    """

    def __init__(self, active: str = BASE) -> None:
        self._active = active
        self._pins: dict[str, str] = {}
        self._lock = threading.Lock()

    @property
    def active(self) -> str:
        """The version new sessions get."""
        return self._active

    def activate(self, version: str) -> None:
        """Route new sessions to ``version`` (pinned sessions keep theirs)."""
        with self._lock:
            self._active = version

    def version_for(self, session: str | None) -> str:
        """The version serving ``session`` (pinning it on first sight); ``None``: active."""
        with self._lock:
            if session is None:
                return self._active
            return self._pins.setdefault(session, self._active)

    def release(self, session: str) -> str | None:
        """Forget a finished session; returns the version it was pinned to."""
        with self._lock:
            return self._pins.pop(session, None)

    def pinned(self) -> dict[str, int]:
        """Version -> number of sessions pinned to it."""
        with self._lock:
            counts: dict[str, int] = {}
            for v in self._pins.values():
                counts[v] = counts.get(v, 0) + 1
            return counts


class AdapterPool:
    """One base model and its loaded LoRA adapters; generation under a lock.

    Args:
        base_model: ``smollm2`` or a local model directory.
        dtype: Weights dtype for serving (``bfloat16`` is ~2x faster than fp32 on this CPU).
        threads: torch threads.
    """

    def __init__(
        self, base_model: str, *, dtype: str = "bfloat16", threads: int | None = None
    ) -> None:
        from evoharness.sdk.serving.base_models import require_training

        require_training()
        from evoharness.sdk.serving.base_models import load_model, load_tokenizer, quiet_threads

        quiet_threads(threads)
        self.base_model = base_model
        self.tokenizer = load_tokenizer(base_model)
        self.model: Any = load_model(base_model, dtype=dtype)
        self.model.eval()
        self._peft = False
        self._paths: dict[str, str] = {}
        self._lock = threading.RLock()
        self.swap_seconds: list[float] = []

    @property
    def adapters(self) -> dict[str, str]:
        """Loaded adapter name -> path."""
        return dict(self._paths)

    def load(self, name: str, path: str | Path) -> None:
        """Load the adapter at ``path`` as ``name`` (a loaded name is never re-pointed)."""
        if name == BASE:
            raise ConfigError(f"{BASE!r} is reserved for the base model", field="name")
        path = str(path)
        with self._lock:
            if name in self._paths:
                if self._paths[name] != path:
                    raise ConfigError(
                        f"adapter name {name!r} is already loaded from {self._paths[name]}; "
                        "names are immutable: publish a new version",
                        field="name",
                    )
                return
            if not self._peft:
                from peft import PeftModel

                self.model = PeftModel.from_pretrained(self.model, path, adapter_name=name)
                self.model.eval()
                self._peft = True
            else:
                self.model.load_adapter(path, adapter_name=name)
            self._paths[name] = path

    def unload(self, name: str) -> None:
        """Drop an adapter from memory."""
        with self._lock:
            if name not in self._paths:
                return
            remaining = [n for n in self._paths if n != name]
            if remaining:
                self.model.set_adapter(remaining[0])
                self.model.delete_adapter(name)
            else:
                self.model = self.model.unload()  # back to the plain base model
                self._peft = False
            del self._paths[name]

    def _select(self, version: str) -> Any:
        """Activate ``version`` and return a context manager for the generate call."""
        import contextlib

        if version == BASE:
            if self._peft:
                return self.model.disable_adapter()
            return contextlib.nullcontext()
        if version not in self._paths:
            raise ConfigError(
                f"adapter {version!r} is not loaded; load it first (loaded: "
                f"{', '.join(self._paths) or 'none'})",
                field="adapter",
            )
        started = time.perf_counter()
        if self.model.active_adapter != version:
            self.model.set_adapter(version)
            self.swap_seconds.append(time.perf_counter() - started)
        return contextlib.nullcontext()

    def generate(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        version: str = BASE,
        max_new_tokens: int = 256,
        temperature: float = 0.0,
    ) -> tuple[str, list[int], list[int]]:
        """Complete a chat: ``(text, prompt_token_ids, completion_token_ids)``."""
        import torch

        enc = self.tokenizer.apply_chat_template(
            messages,
            tools=tools or None,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            return_tensors="pt",
        )
        sample: dict[str, Any] = {"do_sample": False}
        if temperature > 0:
            sample = {"do_sample": True, "temperature": temperature}
        with self._lock, self._select(version), torch.inference_mode():
            out = self.model.generate(
                **enc,
                max_new_tokens=max_new_tokens,
                pad_token_id=self.tokenizer.pad_token_id,
                eos_token_id=self.tokenizer.eos_token_id,
                **sample,
            )
        prompt_ids = enc["input_ids"][0].tolist()
        completion_ids = out[0][len(prompt_ids) :].tolist()
        text = self.tokenizer.decode(completion_ids, skip_special_tokens=True)
        return text, prompt_ids, completion_ids


def current_session(config: RunnableConfig | None = None) -> str | None:
    """The LangGraph ``thread_id`` of ``config`` (default: the run calling the model)."""
    configurable = (config or ensure_config()).get("configurable") or {}
    thread = configurable.get("thread_id")
    return str(thread) if thread is not None else None


class LocalChatModel(BaseChatModel):
    """A chat model served from an :class:`AdapterPool`.

    Attributes:
        pool: The shared base model + adapters.
        router: Picks the version per session; ``None`` with ``adapter`` fixed.
        adapter: A fixed version (``base`` or an adapter name) when there is no router.
        max_new_tokens: Completion budget per call.
        temperature: 0 is greedy.
        on_reply: Called with every reply (for metrics in benchmarks).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    pool: Any
    router: SessionRouter | None = None
    adapter: str = BASE
    max_new_tokens: int = Field(256, ge=1)
    temperature: float = 0.0
    on_reply: Callable[[AIMessage], None] | None = None

    @property
    def _llm_type(self) -> str:
        return "evoharness-local"

    def bind_tools(
        self, tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool], **kwargs: Any
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools; they are rendered into the prompt by the chat template."""
        schemas = [convert_to_openai_tool(t) for t in tools]
        return self.bind(tools=schemas, **kwargs)

    def invoke(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> AIMessage:
        """As ``BaseChatModel.invoke``; the config's ``thread_id`` picks the pinned version."""
        kwargs.setdefault("session", current_session(config))
        return super().invoke(input, config, stop=stop, **kwargs)

    async def ainvoke(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> AIMessage:
        """As ``BaseChatModel.ainvoke``; the config's ``thread_id`` picks the pinned version."""
        kwargs.setdefault("session", current_session(config))
        return await super().ainvoke(input, config, stop=stop, **kwargs)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        tools = kwargs.get("tools")
        session = kwargs.get("session") or current_session()
        version = self.router.version_for(session) if self.router else self.adapter
        text, prompt_ids, completion_ids = self.pool.generate(
            to_chat(messages),
            tools=tools,
            version=version,
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
        )
        content, calls, invalid = parse_tool_calls(text)
        message = AIMessage(
            content=content,
            tool_calls=calls,
            invalid_tool_calls=invalid,
            response_metadata={
                "model_name": f"{self.pool.base_model}:{version}",
                "adapter": version,
                "prompt_token_ids": prompt_ids,
                "completion_token_ids": completion_ids,
                "raw_text": text,
            },
            usage_metadata={
                "input_tokens": len(prompt_ids),
                "output_tokens": len(completion_ids),
                "total_tokens": len(prompt_ids) + len(completion_ids),
            },
        )
        if self.on_reply is not None:
            self.on_reply(message)
        return ChatResult(generations=[ChatGeneration(message=message)])
