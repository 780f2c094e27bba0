"""A loopback OpenAI-compatible chat endpoint with a fixed latency (for benchmarks/tests).

``POST /v1/chat/completions`` answers after ``latency_s`` with ``reply(messages)`` as the
assistant message. It is a small asyncio HTTP/1.1 server (keep-alive, Content-Length
bodies only), so thousands of concurrent waits cost next to nothing and the latency the
client sees is the configured one, not the server's own overhead.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from typing import Any

ReplyFn = Callable[[list[dict[str, Any]]], str]


class OpenAIStandIn:
    """Start with ``with OpenAIStandIn(latency_s=0.1, reply=...) as api:``; use ``api.base_url``.

    Attributes:
        requests: How many completions were served.
        max_in_flight: The highest number of requests waiting at the same time.
    """

    def __init__(self, *, latency_s: float = 0.1, reply: ReplyFn | None = None) -> None:
        self.latency_s = latency_s
        self.reply = reply or (lambda messages: "ok")
        self.requests = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _route(self, method: str, path: str, body: dict[str, Any]) -> tuple[int, Any] | None:
        """``(status, JSON)`` for requests a subclass serves itself; ``None``: a completion."""
        return None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = json.loads(await reader.readexactly(length)) if length else {}
                method, path = head.split(b"\r\n", 1)[0].decode().split(" ")[:2]
                routed = self._route(method, path, body)
                if routed is not None:  # an endpoint of a subclass (see the LoRA section)
                    status, data = routed
                    raw = json.dumps(data).encode()
                    writer.write(
                        f"HTTP/1.1 {status} {'OK' if status < 400 else 'Error'}\r\n".encode()
                        + b"Content-Type: application/json\r\nContent-Length: "
                        + str(len(raw)).encode()
                        + b"\r\n\r\n"
                        + raw
                    )
                    await writer.drain()
                    continue
                self.in_flight += 1
                self.max_in_flight = max(self.max_in_flight, self.in_flight)
                await asyncio.sleep(self.latency_s)
                self.in_flight -= 1
                self.requests += 1
                payload = json.dumps(
                    {
                        "id": f"chatcmpl-{self.requests}",
                        "object": "chat.completion",
                        "created": int(time.time()),
                        "model": body.get("model", "standin"),
                        "choices": [
                            {
                                "index": 0,
                                "finish_reason": "stop",
                                "message": {
                                    "role": "assistant",
                                    "content": self.reply(body.get("messages", [])),
                                },
                            }
                        ],
                        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
                    }
                ).encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def _run(self) -> None:
        async def main() -> None:
            self._stop = asyncio.Event()
            server = await asyncio.start_server(self._handle, "127.0.0.1", 0, backlog=1024)
            self.port = server.sockets[0].getsockname()[1]
            self._ready.set()
            async with server:
                await self._stop.wait()
            # close kept-alive client connections while the loop still runs (otherwise
            # their handlers die with the loop and warn about a closed loop)
            pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

        self._loop = asyncio.new_event_loop()
        self._loop.run_until_complete(main())
        self._loop.close()

    def __enter__(self) -> OpenAIStandIn:
        self._thread = threading.Thread(target=self._run, daemon=True, name="openai-standin")
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(5)


# ---------------------------------------------------------------------------------------------
# vLLM runtime-LoRA stand-in (weights layer). A SIMULATED vLLM replica: runtime adapter loading
# (``/v1/load_lora_adapter``, ``/v1/unload_lora_adapter``), ``GET /v1/models``, requests that
# pick an adapter by ``model``, token ids/logprobs on request, a restart that forgets runtime
# adapters, and a failing mode. No weights are read: adapter "paths" are just recorded.
# ---------------------------------------------------------------------------------------------


class LoRAServingStandIn(OpenAIStandIn):
    """A loopback stand-in for one vLLM replica with ``--enable-lora`` and runtime updating.

    Attributes:
        base_model: The served base model id.
        adapters: Loaded adapter name -> path.
        served: Completions served per model id.
        fail_loads: When true, ``load_lora_adapter`` answers 500 (a replica that cannot load).
        max_loras: Adapters that fit at once (vLLM's ``--max-cpu-loras`` analogue).
    """

    def __init__(
        self,
        *,
        base_model: str = "standin-base",
        reply: ReplyFn | None = None,
        max_loras: int = 8,
    ) -> None:
        super().__init__(latency_s=0.0, reply=reply)
        self.base_model = base_model
        self.adapters: dict[str, str] = {}
        self.served: dict[str, int] = {}
        self.fail_loads = False
        self.max_loras = max_loras
        self.loads = 0

    def restart(self) -> None:
        """Simulate a replica restart: runtime-loaded adapters are gone."""
        self.adapters.clear()

    def _models(self) -> dict[str, Any]:
        data = [{"id": self.base_model, "object": "model", "root": self.base_model, "parent": None}]
        data += [
            {"id": n, "object": "model", "root": p, "parent": self.base_model}
            for n, p in self.adapters.items()
        ]
        return {"object": "list", "data": data}

    def _route(self, method: str, path: str, body: dict[str, Any]) -> tuple[int, Any] | None:
        if method == "GET" and path == "/v1/models":
            return 200, self._models()
        if method == "POST" and path == "/v1/load_lora_adapter":
            name, lora_path = body.get("lora_name"), body.get("lora_path")
            if self.fail_loads:
                return 500, {"error": {"message": f"failed to load {name} (simulated)"}}
            if not name or not lora_path:
                return 400, {"error": {"message": "lora_name and lora_path are required"}}
            if name in self.adapters:
                return 400, {
                    "error": {"message": f"The lora adapter '{name}' has already been loaded."}
                }
            if len(self.adapters) >= self.max_loras:
                return 500, {"error": {"message": "no free LoRA slot"}}
            self.adapters[name] = lora_path
            self.loads += 1
            return 200, {"message": f"Success: LoRA adapter '{name}' added successfully."}
        if method == "POST" and path == "/v1/unload_lora_adapter":
            name = body.get("lora_name")
            if name not in self.adapters:
                return 404, {"error": {"message": f"The lora adapter '{name}' cannot be found."}}
            del self.adapters[name]
            return 200, {"message": f"Success: LoRA adapter '{name}' removed successfully."}
        if method == "POST" and path == "/v1/chat/completions":
            model = body.get("model", self.base_model)
            if model != self.base_model and model not in self.adapters:
                return 404, {"error": {"message": f"The model `{model}` does not exist.",
                                       "type": "NotFoundError", "code": 404}}  # fmt: skip
            self.served[model] = self.served.get(model, 0) + 1
            self.requests += 1
            text = self.reply(body.get("messages", []))
            completion_ids = [1000 + (ord(c) % 200) for c in text] or [0]
            choice: dict[str, Any] = {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": text},
            }
            result: dict[str, Any] = {
                "id": f"chatcmpl-{self.requests}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "choices": [choice],
                "usage": {
                    "prompt_tokens": 7,
                    "completion_tokens": len(completion_ids),
                    "total_tokens": 7 + len(completion_ids),
                },
            }
            if body.get("return_token_ids"):
                result["prompt_token_ids"] = [1, 2, 3, 4, 5, 6, 7]
                choice["token_ids"] = completion_ids
            if body.get("logprobs"):
                choice["logprobs"] = {
                    "content": [
                        {"token": c, "logprob": -0.5, "bytes": list(c.encode()), "top_logprobs": []}
                        for c in text
                    ]
                }
            return 200, result
        return None


def serve(latency_s: float, reply: ReplyFn | None = None) -> None:  # pragma: no cover
    """Run the stand-in in this process until killed; prints its base URL first."""
    with OpenAIStandIn(latency_s=latency_s, reply=reply) as api:
        print(api.base_url, flush=True)
        threading.Event().wait()


if __name__ == "__main__":  # pragma: no cover - used by benchmarks as a separate process
    import argparse
    import importlib

    parser = argparse.ArgumentParser(description="OpenAI-compatible stand-in endpoint")
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--reply", help="module:function producing the reply text")
    a = parser.parse_args()
    fn = None
    if a.reply:
        module, _, name = a.reply.partition(":")
        fn = getattr(importlib.import_module(module), name)
    serve(a.latency, fn)
