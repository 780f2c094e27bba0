"""A LangChain chat model over transformers + PEFT: tool calls, adapter hot-swap, session pins.

One base model stays in memory; LoRA adapters are loaded next to it with PEFT's
``PeftModel.load_adapter`` and switched per call with ``set_adapter`` (~10 ms on a CPU). A
:class:`SessionRouter` pins each session (LangGraph ``thread_id``) to the adapter version that
was active when the session started, so a swap never changes a conversation midway.

Tools are rendered by the tokenizer's chat template (TRL's Qwen2.5 training template for
SmolLM2); the reply's ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks
become ``AIMessage.tool_calls``, unparseable ones ``invalid_tool_calls``.

A conversation is rendered exactly as the training path renders the same conversation read
back from its trace (:func:`to_chat`: arguments in the order written, as traces store them),
so an adapter sees at serving time the token ids it was trained on. A reply whose tool calls
did not parse (the harness answers them with an error observation) is shown to the model as
the text it really wrote, not as the empty-argument call the harness keeps in the history.

A version that cannot serve (its load failed, or it was unloaded) does not fail the sessions
routed to it: they are served by the previous active version that is loaded, else the base
model, and the reply says so (``response_metadata["adapter"]`` is the version that served,
``response_metadata["adapter_fallback"]`` what was asked for and why). A load that fails
raises :class:`~evoharness.sdk.serving.errors.AdapterLoadError` naming the adapter and its
directory, and leaves the pool as it was.

Successive calls of a session share their prefix (the previous prompt and reply): the pool
keeps the attention cache of its last few completions per adapter and prefills only the new
tokens (the prefix caching an inference server does).

Needs the ``train`` extra (torch, transformers, peft).
"""

from __future__ import annotations

import functools
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, TypeVar, cast

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
from langchain_core.runnables import Runnable, RunnableConfig, ensure_config
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import ConfigDict, Field

from evoharness.harness import ConfigError
from evoharness.harness.control.reply_check import MALFORMED_KEY
from evoharness.sdk._reply_model import ReplyChatModel
from evoharness.sdk.serving.errors import AdapterLoadError

log = logging.getLogger("evoharness.serving")

BASE = "base"
"""The version name that means the base model with no adapter."""

FALLBACK_KEY = "adapter_fallback"
"""Where a reply served by a fallback version says so (``response_metadata``):
``{"requested": ..., "served": ..., "reason": ...}``."""

_SERVED = re.compile(r"^(?P<policy>.+)-v(?P<version>\d+)$")
_HISTORY = 16  # versions a router remembers having activated (its fallbacks)

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
    """LangChain messages as chat-template messages (tool calls with dict arguments).

    Arguments keep the order the model wrote them in, which is the order traces store them
    in (so the training path renders a traced conversation to the same tokens). A reply
    whose calls did not parse (marked by the harness's reply check) is rendered from its raw
    completion text when the serving model kept it (``response_metadata["raw_text"]``).
    """
    out: list[dict[str, Any]] = []
    for m in messages:
        text = m.content if isinstance(m.content, str) else m.text
        if isinstance(m, SystemMessage):
            out.append({"role": "system", "content": text})
        elif isinstance(m, HumanMessage):
            out.append({"role": "user", "content": text})
        elif isinstance(m, AIMessage):
            raw = m.response_metadata.get("raw_text")
            if m.response_metadata.get(MALFORMED_KEY) and isinstance(raw, str):
                # what the model really wrote; the error observation that follows then
                # makes sense (the history otherwise shows a call with empty arguments,
                # which a small model copies into every later call)
                out.append({"role": "assistant", "content": raw.strip()})
                continue
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
        self._history = [active]  # activated versions, oldest first, each once
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
            if version in self._history:
                self._history.remove(version)
            self._history.append(version)
            del self._history[:-_HISTORY]

    def previous(self, version: str) -> list[str]:
        """The versions active before ``version`` was activated, newest first (all that were
        active when it never was): where its sessions fall back when it cannot serve."""
        with self._lock:
            history = self._history
            before = history[: history.index(version)] if version in history else history
            return before[::-1]

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
        prefix_cache: Attention caches of the last completions kept (per pool) to prefill
            only the tokens a follow-up prompt adds; 0 turns prefix caching off.
    """

    def __init__(
        self,
        base_model: str,
        *,
        dtype: str = "bfloat16",
        threads: int | None = None,
        prefix_cache: int = 4,
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
        self.prefix_cache = prefix_cache
        # (version, token ids the cache holds, cache), most recent first
        self._prefixes: list[tuple[str, list[int], Any]] = []
        self.prefill_tokens = 0
        """Prompt tokens actually prefilled (the rest came from the prefix cache)."""
        self.load_failures: dict[str, str] = {}
        """Adapter name -> why its last load failed (cleared by a load that succeeds)."""
        self._warned: set[str] = set()

    @property
    def adapters(self) -> dict[str, str]:
        """Loaded adapter name -> path."""
        return dict(self._paths)

    def load(self, name: str, path: str | Path) -> None:
        """Load the adapter at ``path`` as ``name`` (a loaded name is never re-pointed).

        Raises:
            ConfigError: ``name`` is reserved or already loaded from another directory.
            AdapterLoadError: The directory is missing, a file is unreadable or corrupt, or
                the adapter does not fit the base model; the pool is left as it was.
        """
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
            try:
                if not Path(path).is_dir():  # PEFT would look the path up on the Hub
                    raise FileNotFoundError(
                        "the directory does not exist"
                        if not Path(path).exists()
                        else "it is not a directory"
                    )
                self._load_peft(name, path)
            except Exception as exc:  # PEFT, safetensors, json and torch each raise their own
                self._discard(name)
                reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
                self.load_failures[name] = reason
                raise AdapterLoadError(
                    f"adapter {name!r} could not be loaded from {path} ({reason}); restore its "
                    "files or publish a new version (sessions routed to it are served by the "
                    "previous active version meanwhile)",
                    adapter=name,
                    path=path,
                    reason=reason,
                ) from exc
            self.load_failures.pop(name, None)
            self._paths[name] = path

    def _load_peft(self, name: str, path: str) -> None:
        if not self._peft:
            from peft import PeftModel

            self.model = PeftModel.from_pretrained(self.model, path, adapter_name=name)
            self.model.eval()
            self._peft = True
        else:
            self.model.load_adapter(path, adapter_name=name)

    def _discard(self, name: str) -> None:
        """Undo what a failed load of ``name`` left: PEFT injects an adapter's layers before
        it reads the weights, so a corrupt or mismatched file leaves them behind."""
        if self._peft:
            if name in getattr(self.model, "peft_config", {}):
                active = self.model.active_adapter
                self.model.delete_adapter(name)
                if active != name and active in self._paths:
                    self.model.set_adapter(active)
            return
        from peft.tuners.tuners_utils import BaseTunerLayer

        for key, module in list(self.model.named_modules()):
            if isinstance(module, BaseTunerLayer):
                parent, _, child = key.rpartition(".")
                setattr(self.model.get_submodule(parent), child, module.get_base_layer())
        if hasattr(self.model, "peft_config"):
            del self.model.peft_config

    def resolve(self, version: str, previous: Sequence[str] = ()) -> tuple[str, str | None]:
        """The version that serves a call asked for ``version``, and why when they differ.

        ``version`` itself when it is loaded (or the base); else the first of ``previous``
        (the versions active before it, newest first) that is loaded; else the newest loaded
        version of the same policy older than it (``<policy>-v<K>``, K < N); else the base.
        """
        with self._lock:
            loaded = set(self._paths)
            failed = self.load_failures.get(version)
        if version == BASE or version in loaded:
            return version, None
        served = next((v for v in previous if v == BASE or v in loaded), None)
        if served is None:
            served = _older_of_policy(version, loaded) or BASE
        why = f"its load failed ({failed})" if failed else "it is not loaded"
        reason = f"adapter {version!r} cannot serve: {why}; served by {served!r}"
        if version not in self._warned:  # once per version: every call would repeat it
            self._warned.add(version)
            log.warning("%s", reason)
        return served, reason

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
            self._prefixes = [p for p in self._prefixes if p[0] != name]

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

    def encode(self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None) -> Any:
        """The prompt of a chat as the model gets it (the chat template with the tools and
        the generation prompt), as a ``BatchEncoding`` of tensors."""
        return self.tokenizer.apply_chat_template(
            messages,
            tools=tools or None,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            return_tensors="pt",
        )

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

        enc = self.encode(messages, tools=tools)
        sample: dict[str, Any] = {"do_sample": False}
        if temperature > 0:
            sample = {"do_sample": True, "temperature": temperature}
        prompt_ids: list[int] = enc["input_ids"][0].tolist()
        cache_arg = _cache_arg()
        with self._lock, self._select(version), torch.inference_mode():
            cache = self._take_prefix(version, prompt_ids)
            out = self.model.generate(
                **enc,
                max_new_tokens=max_new_tokens,
                pad_token_id=self.tokenizer.pad_token_id,
                eos_token_id=self.tokenizer.eos_token_id,
                **{cache_arg: cache},
                return_dict_in_generate=True,
                **sample,
            )
            ids: list[int] = out.sequences[0].tolist()
            self._keep_prefix(version, ids, getattr(out, cache_arg, None))
        completion_ids = ids[len(prompt_ids) :]
        text = self.tokenizer.decode(completion_ids, skip_special_tokens=True)
        return text, prompt_ids, completion_ids

    def generate_batch(
        self,
        chats: Sequence[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]],
        *,
        version: str = BASE,
        max_new_tokens: int = 256,
        temperature: float = 0.0,
    ) -> list[tuple[str, list[int], list[int]]]:
        """Complete several chats ``(messages, tools)`` in one batch (left-padded), each as
        :meth:`generate` would: ``(text, prompt_token_ids, completion_token_ids)``.

        A batch of 4 short BFCL prompts took 58 s against 175 s one by one on 2 busy
        cores: decoding a 0.5B model reads every weight once per step, whatever the batch.
        Batched greedy completions can differ from unbatched ones in the last bits of the
        logits (padding changes the kernels' shapes); the prefix cache is not used.
        """
        import torch

        if not chats:
            return []
        prompts: list[list[int]] = [
            self.encode(messages, tools=tools)["input_ids"][0].tolist() for messages, tools in chats
        ]
        pad = self.tokenizer.pad_token_id
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        sample: dict[str, Any] = {"do_sample": False}
        if temperature > 0:
            sample = {"do_sample": True, "temperature": temperature}
        eos = self.tokenizer.eos_token_id
        configured = getattr(self.model.generation_config, "eos_token_id", None)
        stops = {configured} if isinstance(configured, int) else set(configured or [])
        stops.add(eos)  # a row ends at its first stop token; later ones are padding
        with self._lock, self._select(version), torch.inference_mode():
            out = self.model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=max_new_tokens,
                pad_token_id=pad,
                eos_token_id=eos,
                **sample,
            )
        results: list[tuple[str, list[int], list[int]]] = []
        for prompt, row in zip(prompts, out.tolist(), strict=True):
            completion = row[width:]
            end = next((i + 1 for i, t in enumerate(completion) if t in stops), len(completion))
            completion = completion[:end]
            text = self.tokenizer.decode(completion, skip_special_tokens=True)
            results.append((text, prompt, completion))
        return results

    def _take_prefix(self, version: str, prompt_ids: list[int]) -> Any:
        """The kept cache sharing the longest prefix with ``prompt_ids``, cropped to it
        (``None``: prefill everything). At least the last prompt token is recomputed."""
        best, best_len = -1, 0
        for i, (v, ids, _) in enumerate(self._prefixes):
            if v != version:
                continue
            n = _common_prefix(ids, prompt_ids)
            if n > best_len:
                best, best_len = i, n
        usable = min(best_len, len(prompt_ids) - 1)
        if best < 0 or usable < 1:
            self.prefill_tokens += len(prompt_ids)
            return None
        _, _, cache = self._prefixes.pop(best)
        extra = int(cache.get_seq_length()) - usable
        if extra > 0:
            cache.crop(-extra)  # negative: tokens to drop (every transformers 5 release)
        self.prefill_tokens += len(prompt_ids) - usable
        return cache

    def _keep_prefix(self, version: str, ids: list[int], cache: Any) -> None:
        if self.prefix_cache <= 0 or cache is None:
            return
        held = int(cache.get_seq_length())  # the last generated token was never fed back
        self._prefixes.insert(0, (version, ids[:held], cache))
        del self._prefixes[self.prefix_cache :]


@functools.cache
def _cache_arg() -> str:
    """``cache`` (transformers >= 5.2x) or ``past_key_values`` (older 5.x): the generate
    argument and output field that carry the attention cache."""
    try:
        from transformers.generation.utils import GenerateDecoderOnlyOutput
    except ImportError:  # pragma: no cover - the train extra is missing
        return "past_key_values"
    fields = getattr(GenerateDecoderOnlyOutput, "__dataclass_fields__", {})
    return "cache" if "cache" in fields else "past_key_values"


def _older_of_policy(version: str, loaded: set[str]) -> str | None:
    """The newest of ``loaded`` named ``<policy>-v<K>`` with K below ``version``'s N."""
    match = _SERVED.match(version)
    if match is None:
        return None
    best: tuple[int, str] | None = None
    for name in loaded:
        other = _SERVED.match(name)
        if other is None or other["policy"] != match["policy"]:
            continue
        k = int(other["version"])
        if k < int(match["version"]) and (best is None or k > best[0]):
            best = (k, name)
    return best[1] if best else None


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def current_session(config: RunnableConfig | None = None) -> str | None:
    """The LangGraph ``thread_id`` of ``config`` (default: the run calling the model)."""
    configurable = (config or ensure_config()).get("configurable") or {}
    thread = configurable.get("thread_id")
    return str(thread) if thread is not None else None


_Call = TypeVar("_Call", bound=Callable[..., Any])


def _passing_session(call: _Call) -> _Call:
    """``BaseChatModel.invoke`` or ``ainvoke`` (``call``, whose coroutine an async one
    returns) passing the session of the call's config on to the model as ``session``."""

    @functools.wraps(call)
    def passing(
        self: BaseChatModel,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        **kwargs: Any,
    ) -> Any:
        kwargs.setdefault("session", current_session(config))
        return call(self, input, config, **kwargs)

    return cast(_Call, passing)


class LocalChatModel(ReplyChatModel):
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

    def with_adapter(self, adapter: str) -> LocalChatModel:
        """A copy that serves ``adapter`` on every call (the session door pins it); when it
        cannot serve, the newest loaded older version of its policy does, else the base."""
        return self.model_copy(update={"adapter": adapter, "router": None})

    def _serving(self, requested: str) -> tuple[str, str | None]:
        """The version serving a call routed to ``requested``, and why when it is another
        (a pool without :meth:`AdapterPool.resolve`, such as a test's stand-in, serves it)."""
        resolve = getattr(self.pool, "resolve", None)
        if resolve is None:
            return requested, None
        previous = self.router.previous(requested) if self.router is not None else ()
        served, reason = resolve(requested, previous)
        return str(served), reason

    def bind_tools(
        self, tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool], **kwargs: Any
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools; they are rendered into the prompt by the chat template."""
        schemas = [convert_to_openai_tool(t) for t in tools]
        return self.bind(tools=schemas, **kwargs)

    # the config's thread_id picks the pinned version: passed on to _reply as ``session``
    invoke: ClassVar = _passing_session(ReplyChatModel.invoke)
    ainvoke: ClassVar = _passing_session(ReplyChatModel.ainvoke)

    def _reply(self, messages: list[BaseMessage], **kwargs: Any) -> AIMessage:
        tools = kwargs.get("tools")
        session = kwargs.get("session") or current_session()
        requested = self.router.version_for(session) if self.router else self.adapter
        version, fallback = self._serving(requested)
        text, prompt_ids, completion_ids = self.pool.generate(
            to_chat(messages),
            tools=tools,
            version=version,
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
        )
        content, calls, invalid = parse_tool_calls(text)
        meta: dict[str, Any] = {
            "model_name": f"{self.pool.base_model}:{version}",
            "adapter": version,
            "prompt_token_ids": prompt_ids,
            "completion_token_ids": completion_ids,
            "raw_text": text,
        }
        if fallback is not None:
            meta[FALLBACK_KEY] = {"requested": requested, "served": version, "reason": fallback}
        message = AIMessage(
            content=content,
            tool_calls=calls,
            invalid_tool_calls=invalid,
            response_metadata=meta,
            usage_metadata={
                "input_tokens": len(prompt_ids),
                "output_tokens": len(completion_ids),
                "total_tokens": len(prompt_ids) + len(completion_ids),
            },
        )
        if self.on_reply is not None:
            self.on_reply(message)
        return message
