"""Pure helpers: canonical messages, conversation hashes, and streamed responses reassembled."""

import hashlib
from typing import Any

import orjson


def canonical_message(message: dict) -> dict:
    """The parts of a message that identify it; clients re-send turns with cosmetic changes."""
    canonical: dict[str, Any] = {
        "role": message.get("role"),
        "content": message.get("content") or "",
    }
    calls = message.get("tool_calls") or []
    if calls:
        canonical["tool_calls"] = [
            [call.get("id"), (call.get("function") or {}).get("name"),
             (call.get("function") or {}).get("arguments")]
            for call in calls
        ]  # fmt: skip
    if message.get("tool_call_id"):
        canonical["tool_call_id"] = message["tool_call_id"]
    return canonical


def conversation_hash(messages: list[dict]) -> str:
    """A chain: the hash of n messages is sha256(hash of the first n - 1 + canonical message n),
    so a conversation's hash extends from any prefix's in the cost of the messages added."""
    return prefix_digests(messages, {len(messages)})[len(messages)]


def prefix_digests(
    messages: list[dict], lengths: set[int], *, start: int = 0, start_hash: str = ""
) -> dict[int, str]:
    """conversation_hash(messages[:n]) for each n >= start in lengths, in one pass over
    messages[start:]; `start_hash` is conversation_hash(messages[:start]) ("" for none)."""
    running = bytes.fromhex(start_hash)
    digests = {start: start_hash} if start in lengths else {}
    last = max(lengths, default=start)
    for length in range(start + 1, min(last, len(messages)) + 1):
        message = orjson.dumps(canonical_message(messages[length - 1]))
        running = hashlib.sha256(running + message).digest()
        if length in lengths:
            digests[length] = running.hex()
    return digests


def assistant_ends(messages: list[dict]) -> set[int]:
    """The lengths of the prefixes that end in an assistant turn."""
    return {i + 1 for i, message in enumerate(messages) if message.get("role") == "assistant"}


def prefix_hashes(messages: list[dict]) -> dict[str, int]:
    """Hash of every prefix that ends in an assistant turn -> its length."""
    return {
        digest: length
        for length, digest in prefix_digests(messages, assistant_ends(messages)).items()
    }


def common_prefix_length(stored: list[dict], incoming: list[dict]) -> int:
    length = 0
    for old, new in zip(stored, incoming, strict=False):
        if canonical_message(old) != canonical_message(new):
            break
        length += 1
    return length


class StreamAssembler:
    """Rebuild a chat completion from its server-sent event chunks, as the client received it."""

    def __init__(self) -> None:
        self._buffer = b""
        self.chunks: list[dict] = []
        self.done = False

    def feed(self, data: bytes) -> None:
        self._buffer += data
        while b"\n\n" in self._buffer:
            event, self._buffer = self._buffer.split(b"\n\n", 1)
            for line in event.splitlines():
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    self.done = True
                    continue
                try:
                    self.chunks.append(orjson.loads(payload))
                except orjson.JSONDecodeError:
                    continue  # not ours to judge; the client got the bytes as they were

    def response(self) -> dict:
        """The chunks folded into one non-streaming response body (choice 0 per index)."""
        choices: dict[int, dict] = {}
        result: dict[str, Any] = {"object": "chat.completion"}
        for chunk in self.chunks:
            for key in ("id", "model", "created", "usage"):
                if chunk.get(key) is not None:
                    result[key] = chunk[key]
            if chunk.get("prompt_token_ids") is not None:
                result["prompt_token_ids"] = chunk["prompt_token_ids"]
            for choice in chunk.get("choices") or ():
                _fold_choice(choices.setdefault(choice.get("index", 0), _empty_choice()), choice)
        result["choices"] = [_finish_choice(index, c) for index, c in sorted(choices.items())]
        return result


def _empty_choice() -> dict:
    return {"content": [], "tool_calls": {}, "finish_reason": None, "logprobs": [], "ids": []}


def _fold_choice(state: dict, choice: dict) -> None:
    delta = choice.get("delta") or {}
    if delta.get("content"):
        state["content"].append(delta["content"])
    for call in delta.get("tool_calls") or ():
        slot = state["tool_calls"].setdefault(
            call.get("index", 0), {"id": "", "type": "function", "name": "", "arguments": []}
        )
        slot["id"] = call.get("id") or slot["id"]
        function = call.get("function") or {}
        slot["name"] += function.get("name") or ""
        slot["arguments"].append(function.get("arguments") or "")
    if choice.get("finish_reason"):
        state["finish_reason"] = choice["finish_reason"]
    logprobs = (choice.get("logprobs") or {}).get("content")
    if logprobs:
        state["logprobs"].extend(logprobs)
    if choice.get("token_ids"):
        state["ids"].extend(choice["token_ids"])


def _finish_choice(index: int, state: dict) -> dict:
    message: dict[str, Any] = {"role": "assistant", "content": "".join(state["content"]) or None}
    if state["tool_calls"]:
        message["tool_calls"] = [
            {
                "id": slot["id"],
                "type": "function",
                "function": {"name": slot["name"], "arguments": "".join(slot["arguments"])},
            }
            for _, slot in sorted(state["tool_calls"].items())
        ]
    choice: dict[str, Any] = {
        "index": index,
        "message": message,
        "finish_reason": state["finish_reason"],
    }
    if state["logprobs"]:
        choice["logprobs"] = {"content": state["logprobs"]}
    if state["ids"]:
        choice["token_ids"] = state["ids"]
    return choice
