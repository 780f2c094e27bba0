"""Serve LoRA adapter versions on vLLM replicas through vLLM's runtime LoRA API.

vLLM runs in its own process/environment (it pins its own torch and transformers; evoharness
never imports it), started with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 vllm serve BASE
--enable-lora --max-loras N --max-lora-rank 16``. This manager drives it over HTTP:

* :meth:`~VLLMAdapterManager.load` posts ``/v1/load_lora_adapter`` to **every** replica,
  verifies the name in each replica's ``/v1/models``, and warms each up with a one-token
  completion; a replica that fails undoes the load everywhere (nothing half-loaded is routable).
* :meth:`~VLLMAdapterManager.activate` routes new sessions to a loaded version; each session
  stays pinned to the version it started with (:meth:`~VLLMAdapterManager.model_for`).
* The replaced version drains: :meth:`~VLLMAdapterManager.collect` unloads it once no session
  is pinned to it and ``grace_s`` has passed since it stopped taking new sessions.
* Names are never reused (vLLM caches by name; new weights under an old name would serve stale
  prefix-cache entries): versions are immutable ``<policy>-v<N>``.
* :meth:`~VLLMAdapterManager.recover` reconciles after a restart: a restarted replica gets its
  adapters loaded again; a restarted manager (with ``state_path``) gets its routing table back
  and adopts what the replicas report.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel, Field

from evoharness.harness import ConfigError, RunError
from evoharness.sdk.serving.openai_capture import CapturingChatOpenAI


class ReplicaError(RunError):
    """A replica refused or failed an adapter operation.

    Attributes:
        replica: The replica's base URL.
        adapter: The adapter name.
        status: The HTTP status (0 when the replica did not answer).
    """

    def __init__(self, message: str, *, replica: str, adapter: str, status: int = 0) -> None:
        super().__init__(message)
        self.replica = replica
        self.adapter = adapter
        self.status = status


class ManagerState(BaseModel):
    """What the manager persists (``state_path``) to survive its own restart."""

    paths: dict[str, str] = Field(default_factory=dict, description="ready name -> path")
    retired: list[str] = Field(default_factory=list, description="unloaded names (never reused)")
    active: str | None = None
    pins: dict[str, str] = Field(default_factory=dict, description="session -> name")
    draining: dict[str, float] = Field(default_factory=dict, description="name -> since")


class VLLMAdapterManager:
    """Load, verify, warm up, route, pin, drain and unload LoRA versions on vLLM replicas.

    Args:
        replicas: Base URLs of the replicas' OpenAI-compatible API (``http://host:8000/v1``).
        base_model: The model id the replicas serve (used when no adapter is active).
        grace_s: How long a drained version stays loaded after its last new session.
        state_path: A JSON file for the routing table (survives a manager restart).
        api_key: Sent as the bearer token (vLLM's ``--api-key``; any value otherwise).
        timeout_s: Per-request timeout.
        clock: Monotonic-ish time source (tests inject one; no sleeping).
    """

    def __init__(
        self,
        replicas: Sequence[str],
        *,
        base_model: str,
        grace_s: float = 300.0,
        state_path: Path | str | None = None,
        api_key: str = "EMPTY",
        timeout_s: float = 60.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not replicas:
            raise ConfigError("VLLMAdapterManager needs at least one replica URL", field="replicas")
        self.replicas = [r.rstrip("/") for r in replicas]
        self.base_model = base_model
        self.grace_s = grace_s
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.clock = clock
        self.state_path = Path(state_path) if state_path else None
        self._lock = threading.RLock()
        self._http = httpx.Client(timeout=timeout_s, headers={"Authorization": f"Bearer {api_key}"})
        self._clients: dict[str, Any] = {}
        self.state = ManagerState()
        if self.state_path is not None and self.state_path.exists():
            self.state = ManagerState.model_validate_json(self.state_path.read_text())

    # -- plumbing ------------------------------------------------------------------------------
    def _save(self) -> None:
        if self.state_path is None:
            return
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(self.state.model_dump_json(indent=2))
        os.replace(tmp, self.state_path)

    def _client(self, replica: str) -> Any:
        client = self._clients.get(replica)
        if client is None:
            from openai import OpenAI

            client = OpenAI(
                base_url=replica, api_key=self.api_key, timeout=self.timeout_s, max_retries=0
            )
            self._clients[replica] = client
        return client

    def _post(self, replica: str, path: str, body: dict[str, Any], adapter: str) -> httpx.Response:
        try:
            return self._http.post(f"{replica}{path}", json=body)
        except httpx.HTTPError as exc:
            raise ReplicaError(
                f"replica {replica} did not answer {path} for {adapter}: {exc}",
                replica=replica,
                adapter=adapter,
            ) from exc

    def served_models(self, replica: str) -> dict[str, str]:
        """Model id -> root (path) that ``replica`` lists in ``/v1/models``."""
        try:
            page = self._client(replica).models.list()
        except Exception as exc:
            raise ReplicaError(
                f"replica {replica} did not list its models: {exc}", replica=replica, adapter=""
            ) from exc
        return {m.id: str(getattr(m, "root", "") or "") for m in page.data}

    def _load_one(self, replica: str, name: str, path: str) -> None:
        r = self._post(replica, "/load_lora_adapter", {"lora_name": name, "lora_path": path}, name)
        if r.status_code >= 400 and "already" not in r.text:
            raise ReplicaError(
                f"replica {replica} failed to load {name} ({r.status_code}): {r.text[:200]}",
                replica=replica,
                adapter=name,
                status=r.status_code,
            )
        if name not in self.served_models(replica):
            raise ReplicaError(
                f"replica {replica} accepted {name} but does not list it in /v1/models",
                replica=replica,
                adapter=name,
                status=r.status_code,
            )
        try:  # warm-up: the first request to a new adapter pays its loading/compilation
            self._client(replica).chat.completions.create(
                model=name, messages=[{"role": "user", "content": "ping"}], max_tokens=1
            )
        except Exception as exc:
            raise ReplicaError(
                f"replica {replica} failed the warm-up request on {name}: {exc}",
                replica=replica,
                adapter=name,
            ) from exc

    def _unload_one(self, replica: str, name: str) -> None:
        r = self._post(replica, "/unload_lora_adapter", {"lora_name": name}, name)
        if r.status_code >= 400 and r.status_code != 404:
            raise ReplicaError(
                f"replica {replica} failed to unload {name} ({r.status_code}): {r.text[:200]}",
                replica=replica,
                adapter=name,
                status=r.status_code,
            )

    # -- lifecycle -----------------------------------------------------------------------------
    def load(self, name: str, path: str) -> None:
        """Load ``name`` from ``path`` on every replica, verify it and warm it up.

        Raises:
            ConfigError: ``name`` was used before (names are never reused).
            ReplicaError: A replica failed; the load was undone on all replicas.
        """
        with self._lock:
            if name in self.state.retired or (
                name in self.state.paths and self.state.paths[name] != path
            ):
                raise ConfigError(
                    f"adapter name {name!r} was already used; never reuse a name for new "
                    "weights (vLLM caches by name): publish a new version",
                    field="name",
                )
            if name == self.base_model:
                raise ConfigError(f"{name!r} is the base model's id", field="name")
            done: list[str] = []
            try:
                for replica in self.replicas:
                    self._load_one(replica, name, path)
                    done.append(replica)
            except ReplicaError:
                for replica in done:
                    # recover() reconciles a replica that cannot be reached now
                    with contextlib.suppress(ReplicaError):
                        self._unload_one(replica, name)
                raise
            self.state.paths[name] = path
            self._save()

    def activate(self, name: str | None) -> None:
        """Route new sessions to ``name`` (``None``: the base model); the previous active
        version starts draining."""
        with self._lock:
            if name is not None and name not in self.state.paths:
                raise ConfigError(
                    f"adapter {name!r} is not loaded on the replicas; load() it first",
                    field="name",
                )
            previous = self.state.active
            self.state.active = name
            self.state.draining.pop(name or "", None)
            if previous is not None and previous != name:
                self.state.draining[previous] = self.clock()
            self._save()

    @property
    def active(self) -> str | None:
        """The version new sessions get (``None``: the base model)."""
        return self.state.active

    def model_for(self, session: str) -> str:
        """The model id serving ``session``, pinning it to the active version on first use."""
        with self._lock:
            name = self.state.pins.get(session)
            if name is None:
                name = self.state.active or self.base_model
                self.state.pins[session] = name
                self._save()
            return name

    def release(self, session: str) -> None:
        """Forget a finished session (its version may then drain)."""
        with self._lock:
            if self.state.pins.pop(session, None) is not None:
                self._save()

    def pinned(self) -> dict[str, int]:
        """Model id -> sessions pinned to it."""
        with self._lock:
            counts: dict[str, int] = {}
            for name in self.state.pins.values():
                counts[name] = counts.get(name, 0) + 1
            return counts

    def drain(self, name: str) -> None:
        """Stop giving ``name`` to new sessions (it must not be the active version)."""
        with self._lock:
            if name == self.state.active:
                raise ConfigError(f"{name!r} is active: activate another version first")
            self.state.draining.setdefault(name, self.clock())
            self._save()

    def collect(self) -> list[str]:
        """Unload drained versions with no pinned session whose grace period has passed."""
        unloaded: list[str] = []
        with self._lock:
            pinned = self.pinned()
            now = self.clock()
            for name, since in sorted(self.state.draining.items()):
                if pinned.get(name) or now - since < self.grace_s:
                    continue
                for replica in self.replicas:
                    self._unload_one(replica, name)
                del self.state.draining[name]
                self.state.paths.pop(name, None)
                self.state.retired.append(name)
                unloaded.append(name)
            if unloaded:
                self._save()
        return unloaded

    def recover(self) -> dict[str, list[str]]:
        """Reconcile with the replicas after a restart (of a replica or of the manager).

        Adapters a replica reports but the manager does not know are adopted (loaded on the
        other replicas too); versions the manager serves that a replica lost are loaded again.

        Returns:
            Replica -> names (re)loaded there.
        """
        reloaded: dict[str, list[str]] = {}
        with self._lock:
            listed = {r: self.served_models(r) for r in self.replicas}
            for models in listed.values():
                for name, root in models.items():
                    known = name in self.state.paths or name in self.state.retired
                    if name != self.base_model and not known:
                        self.state.paths[name] = root
            for replica, models in listed.items():
                for name, path in sorted(self.state.paths.items()):
                    if name not in models:
                        self._load_one(replica, name, path)
                        reloaded.setdefault(replica, []).append(name)
            self._save()
        return reloaded

    # -- requests ------------------------------------------------------------------------------
    def replica_for(self, session: str) -> str:
        """A replica for ``session`` (stable per session: its prefix cache stays warm)."""
        return self.replicas[zlib.crc32(session.encode()) % len(self.replicas)]

    def chat_model(self, session: str, **kwargs: Any) -> CapturingChatOpenAI:
        """A chat model for ``session``: its pinned version on its replica, asking the server
        for token ids and logprobs (kept on ``response_metadata`` for RL)."""
        extra = dict(kwargs.pop("extra_body", None) or {})
        extra.setdefault("return_token_ids", True)
        return CapturingChatOpenAI(
            model=self.model_for(session),
            base_url=self.replica_for(session),
            api_key=self.api_key,
            logprobs=kwargs.pop("logprobs", True),
            extra_body=extra,
            **kwargs,
        )

    def close(self) -> None:
        """Close the HTTP clients."""
        self._http.close()
        for client in self._clients.values():
            client.close()
        self._clients.clear()

    def snapshot(self) -> dict[str, Any]:
        """The routing table, for logs and status commands."""
        with self._lock:
            data: dict[str, Any] = json.loads(self.state.model_dump_json())
            data["pinned"] = self.pinned()
            return data
