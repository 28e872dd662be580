"""A FAKE model server for the fast gateway tests, named as such: it answers the OpenAI chat API
the way vLLM does (JSON and server-sent events) on 127.0.0.1, and can be made slow or broken on
purpose. The real vLLM CPU server is what the slow tests use (tests/gateway/test_gateway_vllm.py).

Behaviour by requested model name: "slow-model" waits 3 s; "broken-model" answers 500;
"drip-model" streams one chunk every 0.3 s for 20 chunks. Anything else echoes the last user
message, cut at `max_tokens` words (finish_reason "length") when the request sets it.
Every request it receives is kept in `requests` (headers and body) for assertions.
"""

import asyncio
import socket
import threading
import time

import orjson
import uvicorn


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class FakeUpstream:
    def __init__(self) -> None:
        self.port = free_port()
        self.requests: list[dict] = []
        self.url = f"http://127.0.0.1:{self.port}/v1"
        config = uvicorn.Config(
            self.app, host="127.0.0.1", port=self.port, log_level="warning", interface="asgi3"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> "FakeUpstream":
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=5)

    async def app(self, scope, receive, send):
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        payload = orjson.loads(body) if body else {}
        self.requests.append({"path": scope["path"], "headers": headers, "body": payload})
        if scope["path"].endswith("/models"):
            await self._json(send, 200, {"object": "list", "data": [{"id": "fake"}]})
        elif payload.get("model") == "broken-model":
            await self._json(send, 500, {"error": {"message": "model crashed", "code": 500}})
        elif payload.get("stream"):
            await self._stream(send, payload)
        else:
            if payload.get("model") == "slow-model":
                await asyncio.sleep(3)
            await self._json(send, 200, self._completion(payload))

    @staticmethod
    def _answer(payload: dict) -> str:
        users = [m for m in payload.get("messages", []) if m.get("role") == "user"]
        return "echo: " + (users[-1]["content"] if users else "")

    def _limited_answer(self, payload: dict) -> tuple[str, str]:
        """The answer and its finish_reason; one word counts as one token."""
        words = self._answer(payload).split(" ")
        limit = payload.get("max_tokens")
        if isinstance(limit, int) and len(words) > limit:
            return " ".join(words[:limit]), "length"
        return " ".join(words), "stop"

    def _completion(self, payload: dict) -> dict:
        text, finish_reason = self._limited_answer(payload)
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": finish_reason,
        }
        if payload.get("return_token_ids"):
            choice["token_ids"] = [11, 12, 13]
        return {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "model": payload.get("model"),
            "choices": [choice],
            "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
        }

    @staticmethod
    async def _json(send, status: int, body: dict) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": orjson.dumps(body)})

    async def _stream(self, send, payload: dict) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        drip = payload.get("model") == "drip-model"
        text, finish_reason = self._limited_answer(payload)
        pieces = [text[i : i + 4] for i in range(0, len(text), 4)] if not drip else ["x"] * 20
        base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "model": payload["model"]}
        chunks = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant"}}]}]
        chunks += [{**base, "choices": [{"index": 0, "delta": {"content": p}}]} for p in pieces]
        done = {"index": 0, "delta": {}, "finish_reason": finish_reason}
        chunks.append({**base, "choices": [done]})
        for chunk in chunks:
            if drip:
                await asyncio.sleep(0.3)
            event = b"data: " + orjson.dumps(chunk) + b"\n\n"
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
