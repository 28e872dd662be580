"""A long agent episode through the gateway's recording path: storage and CPU per call.

Run from the repository root, with PostgreSQL reachable (see bench/README.md):

    python bench/episode.py --calls 1000

An agent loop of --calls model calls, each sending the whole conversation so far plus about
--tool-bytes of new tool output (random letters: they do not compress away), is recorded with
`record_model_call`, the function the gateway's recorder thread runs, into a scratch database.
It reports the bytes stored (trace bodies and segments, calls' requests and responses, the
trace's search text and bookkeeping) against the size of the final conversation, before and
after the episode settles (its segments packed into the body), and the recording CPU of the
last 100 calls against the first 100 and the middle 100: this process's CPU around each call,
and the CPU of its PostgreSQL backend (from /proc, Linux only), medians over --repeat episodes.
Each call is handed the request as the gateway hands it, parsed from its JSON (fresh objects, no
message shared with the previous call); for scale it prints what that parsing costs in the same
windows.
"""

import argparse
import gc
import os
import random
import statistics
import string
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import orjson
from scratch_db import (
    add_admin_url_argument,
    scratch_database,
    scratch_database_url,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from dashboard import setup_django  # noqa: E402

BENCH_DATABASE = "apprentice_bench_episode"
WINDOW = 100  # calls compared at each end of the episode, and in its middle
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name} in the repository",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
    for name in ("read_file", "write_file", "run_tests", "search")
]


@dataclass(frozen=True)
class BenchConfig:
    calls: int
    tool_bytes: int
    header: bool  # X-Trace-Id on every call; off: the trace is found by prefix merging
    repeat: int  # episodes recorded; CPU figures are medians over them
    seed: int
    admin_url: str

    def __post_init__(self):
        if self.calls < 3 * WINDOW:
            raise ValueError(f"--calls must be at least {3 * WINDOW}")
        if self.repeat < 1:
            raise ValueError("--repeat must be at least 1")
        if self.tool_bytes < 0:
            raise ValueError("--tool-bytes must be 0 or more")


def parse_args() -> BenchConfig:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--tool-bytes", type=int, default=1000)
    parser.add_argument(
        "--no-header",
        dest="header",
        action="store_false",
        help="send no X-Trace-Id: the recorder finds the trace by the conversation's prefix",
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=5)
    add_admin_url_argument(parser)
    return BenchConfig(**vars(parser.parse_args()))


def backend_cpu_seconds(pid: int) -> float:
    """User + system CPU of a process, from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def reply(turn: int, final: bool) -> dict:
    if final:
        return {"role": "assistant", "content": f"All tests pass after {turn} steps."}
    name = TOOLS[turn % len(TOOLS)]["function"]["name"]
    function = {"name": name, "arguments": orjson.dumps({"path": f"src/m{turn}.py"}).decode()}
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": f"call_{turn}", "type": "function", "function": function}],
    }


def stored_bytes() -> int:
    """Bytes of what the episode keeps: bodies, segments, calls' requests and responses, the
    trace's search text and bookkeeping (live rows; dead row versions are vacuum's)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (SELECT coalesce(sum(octet_length(body) + octet_length(search_text)"
            "   + octet_length(recording::text)), 0) FROM reviewapp_trace)"
            " + (SELECT coalesce(sum(octet_length(messages)), 0) FROM reviewapp_tracesegment)"
            " + (SELECT coalesce(sum(octet_length(request) + coalesce(octet_length(response), 0)),"
            "   0) FROM reviewapp_modelcall)"
        )
        return cursor.fetchone()[0]


@dataclass
class Episode:
    """One recorded episode: CPU seconds per window (first, middle, last) and what it stored."""

    process: list[float]
    backend: list[float]
    parse: list[float]
    messages: int
    conversation: int  # bytes of the final conversation's JSON (messages + tools)
    whole_requests: int  # bytes of every request's JSON: what storing each whole would hold
    wall: float


def record_episode(config: BenchConfig, project, backend: int) -> Episode:
    """The agent loop, recorded call by call; checks the trace reads back as sent."""
    from django.utils import timezone

    from reviewapp.gateway.calls import RecordedCall, record_model_call
    from reviewapp.traces.models import Trace

    rng = random.Random(config.seed)
    alphabet = string.ascii_letters + string.digits + " \n"
    messages = [
        {"role": "system", "content": "You are a coding agent. Use the tools to fix the bug."},
        {"role": "user", "content": "The test suite fails on module 7; fix it."},
    ]
    started_at = timezone.now() - timedelta(hours=1)
    middle = config.calls // 2 - WINDOW // 2  # the middle window's first call
    windows = [(0, WINDOW), (middle, middle + WINDOW), (config.calls - WINDOW, config.calls)]
    process, parse = [0.0] * 3, [0.0] * 3
    # The backend's CPU so far, after this many calls: at the windows' starts and ends.
    backend_cpu = {0: backend_cpu_seconds(backend)}
    whole_requests = 0
    wall = time.perf_counter()
    for turn in range(config.calls):
        final = turn == config.calls - 1
        window = next((i for i, (a, b) in enumerate(windows) if a <= turn < b), None)
        answer = reply(turn, final)
        raw = orjson.dumps({"model": "agent", "messages": messages, "tools": TOOLS})
        whole_requests += len(raw)
        before = time.process_time()
        request = orjson.loads(raw)  # fresh objects, as the gateway parses every request
        if window is not None:
            parse[window] += time.process_time() - before
        call = RecordedCall(
            project_id=project.pk,
            trace_id_header=f"episode-{project.pk}" if config.header else "",
            requested_model="agent",
            upstream_model="agent",
            adapter_version="",
            upstream_url="http://127.0.0.1:9/v1",
            stream=False,
            request=request,
            response={
                "id": f"chatcmpl-{turn}",
                "object": "chat.completion",
                "choices": [{"index": 0, "message": answer, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 40 * len(messages), "completion_tokens": 20},
            },
            status_code=200,
            termination="completed",
            error="",
            started_at=started_at + timedelta(seconds=turn),
            latency_ms=3.0,
            time_to_first_token_ms=None,
        )
        before = time.process_time()
        record_model_call(call)
        if window is not None:
            process[window] += time.process_time() - before
        if any(turn + 1 in (a, b) for a, b in windows):
            backend_cpu[turn + 1] = backend_cpu_seconds(backend)
        messages.append(answer)
        if not final:
            output = "".join(rng.choices(alphabet, k=config.tool_bytes))
            messages.append({"role": "tool", "tool_call_id": f"call_{turn}", "content": output})
    wall = time.perf_counter() - wall

    trace = Trace.objects.get(project=project)
    assert trace.message_count == len(messages), (trace.message_count, len(messages))
    assert trace.body_json()["messages"] == messages, "the trace does not read back as sent"
    return Episode(
        process=process,
        backend=[backend_cpu[b] - backend_cpu[a] for a, b in windows],
        parse=parse,
        messages=len(messages),
        conversation=len(orjson.dumps({"messages": messages, "tools": TOOLS})),
        whole_requests=whole_requests,
        wall=wall,
    )


def run(config: BenchConfig) -> None:
    os.environ["CELERY_BROKER_URL"] = "memory://"  # the settle task is asked for, never run here
    setup_django(scratch_database_url(config.admin_url, BENCH_DATABASE))
    from django.db import connection

    from reviewapp.gateway.calls import settle_traces
    from reviewapp.projects.services import create_project
    from reviewapp.traces.models import Trace

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend = cursor.fetchone()[0]
    # As the gateway process does once started (reviewapp/asgi.py): the collector does not
    # rescan the startup heap, so what it costs is what recording leaves alive.
    gc.collect()
    gc.freeze()

    # Storage from the first episode alone; CPU as the median over all of them.
    episodes = [record_episode(config, create_project(slug="bench-0", name="Bench"), backend)]
    recorded = stored_bytes()
    settle_traces(trace_ids=[Trace.objects.get().pk], force=True)
    settled = stored_bytes()
    for repeat in range(1, config.repeat):
        project = create_project(slug=f"bench-{repeat}", name="Bench")
        episodes.append(record_episode(config, project, backend))

    first = episodes[0]
    conversation = first.conversation
    middle = config.calls // 2 - WINDOW // 2
    print(
        f"episode: {config.calls} calls, {first.messages} messages, "
        f"X-Trace-Id {'on' if config.header else 'off (prefix merging)'}, "
        f"{statistics.median(e.wall for e in episodes):.1f} s wall (median of {len(episodes)})"
    )
    print(f"final conversation (messages + tools, JSON): {conversation / 1e6:.2f} MB")
    print(f"every request whole (JSON, copies per call): {first.whole_requests / 1e6:.0f} MB")
    print("stored                          bytes      x conversation")
    for label, size in (("recorded (segments)", recorded), ("settled (packed body)", settled)):
        print(f"  {label:28s} {size / 1e6:7.2f} MB  {size / conversation:6.2f}x")
    print(
        f"recording CPU of {WINDOW} calls (calls 1-{WINDOW}, {middle + 1}-{middle + WINDOW},"
        f" {config.calls - WINDOW + 1}-{config.calls}), median of {len(episodes)} episodes:"
    )
    print("                            first      middle        last  last/first  last/middle")

    def median(values: list[list[float]]) -> list[float]:
        return [statistics.median(window) for window in zip(*values, strict=True)]

    for label, (a, m, b) in (
        ("this process", median([e.process for e in episodes])),
        ("PostgreSQL backend", median([e.backend for e in episodes])),
        ("both", median([[p + d for p, d in zip(e.process, e.backend, strict=True)]
                         for e in episodes])),
        ("(parsing the request)", median([e.parse for e in episodes])),
    ):  # fmt: skip
        print(f"  {label:22s} {a * 1000:8.1f} ms {m * 1000:8.1f} ms {b * 1000:8.1f} ms "
              f"{b / a:8.2f}x {b / m:10.2f}x")  # fmt: skip


def main() -> None:
    config = parse_args()
    started = time.perf_counter()
    with scratch_database(config.admin_url, BENCH_DATABASE):
        run(config)
    print(f"done in {time.perf_counter() - started:.0f}s")


if __name__ == "__main__":
    main()
