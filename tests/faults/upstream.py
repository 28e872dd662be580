"""The FAKE model server of tests/fake_upstream.py as a process of its own, so a test can
SIGKILL it the way a crashed vLLM disappears.

    python -m tests.faults.upstream PORT [--die-on PATH_SUFFIX] [--chat-delay SECONDS]

It prints each request's method and path. With --die-on, the process exits at once (no answer)
when a request for that path arrives: vLLM crashing while it loads an adapter. --chat-delay
makes every chat completion that much slower.
"""

import argparse
import asyncio
import os

import uvicorn

from tests.fake_upstream import FakeUpstream


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("--die-on", default="")
    parser.add_argument("--chat-delay", type=float, default=0.0)
    arguments = parser.parse_args()
    fake = FakeUpstream()

    async def app(scope, receive, send):
        if scope["type"] == "http":
            print(scope["method"], scope["path"], flush=True)  # the test reads this log
        if arguments.die_on and scope.get("path", "").endswith(arguments.die_on):
            os._exit(1)
        if scope.get("path", "").endswith("/chat/completions"):
            await asyncio.sleep(arguments.chat_delay)
        await fake.app(scope, receive, send)

    uvicorn.run(app, host="127.0.0.1", port=arguments.port, log_level="warning")


if __name__ == "__main__":
    main()
