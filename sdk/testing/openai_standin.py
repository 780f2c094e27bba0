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

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = json.loads(await reader.readexactly(length)) if length else {}
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
