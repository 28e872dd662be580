"""Gateway overhead: the same chat calls straight to a model server and through the gateway.

Run from the repository root, with PostgreSQL reachable (see bench/README.md):

    python bench/gateway.py --requests 2000 --concurrency 1,8,32

It creates a scratch database, starts a tiny model server of its own (a fixed answer, at once, in
its own process) and the real ASGI app under uvicorn, then sends the same small chat calls to
both, in alternating blocks so that drift on a shared machine hits both alike. It reports latency
(p50, p99), the latency the gateway adds, throughput and the CPU each process spent per call;
then whether recording (off the request path, into PostgreSQL) kept up. If a vLLM server answers
on --vllm-url, a short pass against it gives the figure a harness would see with a real model.
Everything listens on 127.0.0.1; every loop has a count and a time limit.
"""

import argparse
import asyncio
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import orjson
import psutil
import psycopg
from apprentice_server import (
    SERVER_SECRET_KEY,
    free_port,
    server_command,
    server_environment,
    stop_server,
)
from scratch_db import add_admin_url_argument, scratch_database, scratch_database_url

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))  # `python bench/gateway.py` puts bench/, not the root, first

BENCH_DATABASE = "apprentice_bench_gateway"
SERVED_MODEL = "bench-agent"  # the alias the fast project serves; the fast upstream ignores it
VLLM_MODEL = "SmolLM2-135M-Instruct"
REQUEST_TIMEOUT_S = 30.0  # one call to the fast upstream; longer means something is broken
VLLM_REQUEST_TIMEOUT_S = 120.0  # one short generation on a shared CPU
SERVER_START_TIMEOUT_S = 60.0
RECORDING_TIMEOUT_S = 60.0  # how long recording may lag behind the last answer
POLL_INTERVAL_S = 0.02
# DEBUG off makes Django redirect plain HTTP to HTTPS; in production a TLS proxy sends this header.
PROXY_HEADERS = {"X-Forwarded-Proto": "https"}
STREAM_CONCURRENCY = 8
VLLM_CONCURRENCY = (1, 8)
VLLM_MAX_TOKENS = 8
PR_SET_PDEATHSIG = 1  # linux/prctl.h: a signal for the child when its parent dies


@dataclass(frozen=True)
class BenchConfig:
    requests: int  # calls per target (direct, gateway) and concurrency level
    concurrency: tuple[int, ...]  # calls in flight at once, one level after another
    workers: tuple[int, ...]  # uvicorn worker processes for the gateway, one server each
    pin: tuple[str, ...]  # "split": processes on separate cores; "none": the scheduler decides
    blocks: int  # alternating direct/gateway blocks per level (ABBA order)
    stream_requests: int  # streamed calls per target, at STREAM_CONCURRENCY
    vllm_requests: int  # calls per target and level against vLLM; 0 skips the pass
    vllm_url: str
    phase_timeout: float  # seconds one block may take
    max_seconds: float  # the whole run; later blocks are skipped (and said so) past it
    admin_url: str  # an existing database to CREATE and DROP the scratch database from
    ports: tuple[int, int] | None  # the servers listen on free ports in this range; None: any

    def __post_init__(self):
        for name in ("requests", "blocks", "stream_requests"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
        if self.requests < self.blocks:
            raise ValueError("--requests must be at least --blocks")
        if self.vllm_requests < 0:
            raise ValueError("--vllm-requests must be 0 or more")
        if not self.concurrency or min(self.concurrency) < 1:
            raise ValueError("--concurrency: a list of levels, each at least 1")
        if not self.workers or min(self.workers) < 1:
            raise ValueError("--workers: a list of counts, each at least 1")
        if not set(self.pin) <= {"split", "none"} or not self.pin:
            raise ValueError("--pin: a list of 'split' and/or 'none'")

    @property
    def database_url(self) -> str:
        return scratch_database_url(self.admin_url, BENCH_DATABASE)


def _int_list(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(",") if part.strip())


def parse_args(argv: list[str] | None = None) -> BenchConfig:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=_int_list, default=(1, 8, 32))
    parser.add_argument("--workers", type=_int_list, default=(1, 2))
    parser.add_argument(
        "--pin",
        type=lambda text: tuple(text.split(",")),
        default=("split", "none"),
        help="split: load generator + upstream on one core, the gateway on the other(s); none",
    )
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--stream-requests", type=int, default=400)
    parser.add_argument("--vllm-requests", type=int, default=40)
    parser.add_argument("--vllm-url", default="http://127.0.0.1:8100/v1")
    parser.add_argument("--phase-timeout", type=float, default=120.0)
    parser.add_argument("--max-seconds", type=float, default=1500.0)
    add_admin_url_argument(parser)
    parser.add_argument(
        "--ports",
        type=_port_range,
        default=None,
        help="FIRST-LAST: the upstream and the gateway listen on free ports in this range "
        "(default: any free port)",
    )
    return BenchConfig(**vars(parser.parse_args(argv)))


def _port_range(text: str) -> tuple[int, int]:
    first, _, last = text.partition("-")
    ports = int(first), int(last or first)
    if not 0 < ports[0] <= ports[1] < 65536:
        raise argparse.ArgumentTypeError("FIRST-LAST, 1 <= FIRST <= LAST <= 65535")
    return ports


def port_in(ports: tuple[int, int] | None) -> int:
    """A port nothing listens on: any (the kernel's pick), or the first free one in `ports`."""
    if ports is None:
        return free_port()
    for port in range(ports[0], ports[1] + 1):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {ports[0]}-{ports[1]}")


# --- the fast upstream: a model server that answers at once, in its own process ---------------

_UPSTREAM_COMPLETION = orjson.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "model": SERVED_MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Done: the tests pass now."},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 42, "completion_tokens": 8, "total_tokens": 50},
    }
)
_CHUNK_BASE = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "model": SERVED_MODEL}
_STREAM_CHOICES = (
    [{"index": 0, "delta": {"role": "assistant"}}]
    + [{"index": 0, "delta": {"content": word}} for word in ("Done:", "the", "tests", "pass")]
    + [{"index": 0, "delta": {"content": word}} for word in (" now,", " all", " of", " them.")]
    + [{"index": 0, "delta": {}, "finish_reason": "stop"}]
)
_UPSTREAM_EVENTS = [
    b"data: " + orjson.dumps({**_CHUNK_BASE, "choices": [choice]}) + b"\n\n"
    for choice in _STREAM_CHOICES
] + [b"data: [DONE]\n\n"]
_JSON_HEADERS = [(b"content-type", b"application/json")]
_SSE_HEADERS = [(b"content-type", b"text/event-stream")]


async def upstream_app(scope, receive, send) -> None:
    """The fixed completion as JSON, or as ten server-sent events when the body asks to stream."""
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if scope["path"].endswith("/models"):
        await send({"type": "http.response.start", "status": 200, "headers": _JSON_HEADERS})
        await send({"type": "http.response.body", "body": b'{"object":"list","data":[]}'})
        return
    if not (body and orjson.loads(body).get("stream")):
        await send({"type": "http.response.start", "status": 200, "headers": _JSON_HEADERS})
        await send({"type": "http.response.body", "body": _UPSTREAM_COMPLETION})
        return
    await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
    for event in _UPSTREAM_EVENTS:
        await send({"type": "http.response.body", "body": event, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


def serve_upstream(port: int, lifetime: float) -> None:
    """The child process's whole life: serve until told to stop, or `lifetime` seconds."""
    import uvicorn

    def stop_when_expired() -> None:
        time.sleep(lifetime)
        os.kill(os.getpid(), signal.SIGTERM)  # uvicorn shuts down cleanly on SIGTERM

    threading.Thread(target=stop_when_expired, daemon=True).start()
    uvicorn.run(
        upstream_app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="off",
        interface="asgi3",
    )


# --- processes: ports, cores, start and stop --------------------------------------------------


@dataclass(frozen=True)
class CorePlan:
    """Which cores each process may run on; None: wherever the scheduler puts it."""

    load_generator: set[int] | None
    upstream: set[int] | None
    gateway: set[int] | None

    def describe(self) -> str:
        if self.gateway is None:
            return "not pinned (all processes share every core)"
        return (
            f"load generator on cores {sorted(self.load_generator)}, fast upstream on "
            f"{sorted(self.upstream)}, gateway on {sorted(self.gateway)}; "
            "PostgreSQL, vLLM and the rest of the machine not pinned"
        )


def core_plan(pin: str, cores: set[int]) -> CorePlan:
    """`cores`: those this process may use at the start."""
    ordered = sorted(cores)
    if pin == "none" or len(ordered) < 2:
        return CorePlan(None, None, None)
    if len(ordered) == 2:  # the client and the model server share one core, the gateway has one
        return CorePlan({ordered[0]}, {ordered[0]}, {ordered[1]})
    return CorePlan({ordered[0]}, {ordered[1]}, set(ordered[2:]))


def _child_setup(cores: set[int] | None) -> Callable[[], None]:
    """Runs in the child before exec: die with this process, stay on the planned cores."""

    def setup() -> None:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if cores is not None:
            os.sched_setaffinity(0, cores)

    return setup


@contextmanager
def running_process(
    name: str,
    command: list[str],
    *,
    env: dict[str, str],
    cores: set[int] | None,
    ready: Callable[[], bool],
) -> Iterator[subprocess.Popen]:
    """A subprocess that `ready()` confirms is serving; stopped (then killed) on exit."""
    process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, preexec_fn=_child_setup(cores))
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while not ready():
            if process.poll() is not None:
                raise RuntimeError(f"the {name} exited with {process.returncode} at start")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the {name} did not answer in {SERVER_START_TIMEOUT_S:.0f}s")
            time.sleep(0.2)
        yield process
    finally:
        stop_server(process)


def _answers(url: str, headers: dict[str, str] | None = None) -> bool:
    try:
        return httpx.get(url, headers=headers, timeout=2).status_code == 200
    except httpx.TransportError:
        return False


@contextmanager
def running_upstream(
    *, cores: set[int] | None, lifetime: float, ports: tuple[int, int] | None
) -> Iterator[str]:
    port = port_in(ports)
    url = f"http://127.0.0.1:{port}/v1"
    command = [sys.executable, __file__, "--serve-upstream", str(port), str(lifetime)]
    with running_process(
        "fast upstream",
        command,
        env=dict(os.environ),
        cores=cores,
        ready=lambda: _answers(f"{url}/models"),
    ):
        yield url


@contextmanager
def running_gateway(
    *,
    database_url: str,
    workers: int,
    cores: set[int] | None,
    api_key: str,
    ports: tuple[int, int] | None,
) -> Iterator[tuple[str, psutil.Process]]:
    """uvicorn serving the app as production does; yields its base URL and its process."""
    port = port_in(ports)
    env = server_environment(database_url)
    command = server_command(port, workers)
    base_url = f"http://127.0.0.1:{port}"
    headers = {"Authorization": f"Bearer {api_key}", **PROXY_HEADERS}
    ready = lambda: _answers(f"{base_url}/v1/models", headers)  # noqa: E731
    with running_process("gateway", command, env=env, cores=cores, ready=ready) as process:
        yield base_url, psutil.Process(process.pid)


def cpu_seconds(process: psutil.Process, *, event_loops_only: bool = False) -> float:
    """User + system CPU of a process and its children (uvicorn's workers); `event_loops_only`:
    of their main threads only, where requests are served (the recorder and any other work run
    on other threads)."""
    total = 0.0
    for member in [process, *process.children(recursive=True)]:
        try:
            if event_loops_only:
                main = next(t for t in member.threads() if t.id == member.pid)
                total += main.user_time + main.system_time
            else:  # threads that have ended count too
                times = member.cpu_times()
                total += times.user + times.system
        except psutil.NoSuchProcess:
            continue
    return total


# --- the scratch database ---------------------------------------------------------------------


def setup_django(database_url: str) -> None:
    """Point Django at the scratch database and migrate it (this process only creates rows)."""
    os.environ["DATABASE_URL"] = database_url
    os.environ["DJANGO_SETTINGS_MODULE"] = "reviewapp.settings"
    os.environ["DJANGO_DEBUG"] = "false"  # DEBUG on would keep every query in memory
    os.environ["DJANGO_SECRET_KEY"] = SERVER_SECRET_KEY
    os.environ["LOG_LEVEL"] = "WARNING"  # not a line per request from httpx
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def create_project_with_key(*, slug: str, upstream_url: str, served_model: str) -> tuple[int, str]:
    """A project whose upstream is `upstream_url`; its id and a fresh API key."""
    from django.db import connections

    from reviewapp.projects.services import create_api_key, create_project

    project = create_project(slug=slug, upstream_url=upstream_url, served_model=served_model)
    _, secret = create_api_key(project=project, name="bench")
    connections.close_all()  # the server gets the database to itself
    return project.pk, secret


class RecordingProbe:
    """Counts the ModelCall rows of one project, to see recording keep up (or not)."""

    def __init__(self, database_url: str, project_id: int) -> None:
        self._connection = psycopg.connect(database_url, autocommit=True)
        self._project_id = project_id

    def count(self) -> int:
        return self._connection.execute(
            "SELECT count(*) FROM reviewapp_modelcall WHERE project_id = %s", (self._project_id,)
        ).fetchone()[0]

    def wait_for(self, expected: int, since: float) -> float | None:
        """Seconds from `since` (perf_counter) until `expected` rows exist; None: not in time."""
        deadline = time.monotonic() + RECORDING_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.count() >= expected:
                return time.perf_counter() - since
            time.sleep(POLL_INTERVAL_S)
        return None

    def close(self) -> None:
        self._connection.close()


# --- the load generator -----------------------------------------------------------------------


def chat_bodies(count: int, *, model: str, offset: int, stream: bool = False, **extra) -> list:
    """Small harness-like calls, each with its own text (so each starts its own trace)."""
    return [
        orjson.dumps(
            {
                "model": model,
                "messages": [
                    {"role": "system", "content": "You are a careful coding agent. Be brief."},
                    {
                        "role": "user",
                        "content": f"Task {offset + number}: the test in tests/test_app.py "
                        "fails with a KeyError on 'name'. Fix it.",
                    },
                ],
                "stream": stream,
                **extra,
            }
        )
        for number in range(count)
    ]


@dataclass
class Block:
    """One block of calls to one target: what the harness saw."""

    latencies: list[float] = field(default_factory=list)  # seconds, request sent to body read
    first_bytes: list[float] = field(default_factory=list)  # streaming: seconds to first chunk
    errors: int = 0  # answers that were not 200, and calls that got no answer
    elapsed: float = 0.0  # first request sent to last answer
    finished_at: float = 0.0  # perf_counter of the last answer
    unsent: int = 0  # calls not sent because the time limit came first


async def send_block(
    client: httpx.AsyncClient,
    url: str,
    bodies: list[bytes],
    *,
    concurrency: int,
    stream: bool,
    deadline: float,
) -> Block:
    """Send every body, `concurrency` at a time, until all are answered or `deadline`."""
    block = Block()
    queue = iter(bodies)

    async def one_at_a_time() -> None:
        for body in queue:
            if time.monotonic() > deadline:
                block.unsent += 1
                continue
            started = time.perf_counter()
            try:
                if stream:
                    first_byte = None
                    async with client.stream("POST", url, content=body) as response:
                        async for chunk in response.aiter_raw():
                            if chunk and first_byte is None:
                                first_byte = time.perf_counter() - started
                    if first_byte is not None:
                        block.first_bytes.append(first_byte)
                else:
                    response = await client.post(url, content=body)
            except httpx.TransportError:  # no answer: counted, not timed
                block.errors += 1
                continue
            block.latencies.append(time.perf_counter() - started)
            block.errors += response.status_code != 200

    started = time.perf_counter()
    await asyncio.gather(*(one_at_a_time() for _ in range(concurrency)))
    block.finished_at = time.perf_counter()
    block.elapsed = block.finished_at - started
    return block


def percentile(values: list[float], share: float) -> float:
    """Nearest-rank percentile (share in 0..1) of seconds; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered)) - 1))]


@dataclass
class TargetResult:
    """One target (direct or gateway) at one level: its blocks pooled."""

    latencies: list[float] = field(default_factory=list)
    first_bytes: list[float] = field(default_factory=list)
    errors: int = 0
    unsent: int = 0
    elapsed: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)  # process -> CPU seconds in its blocks

    def add(self, block: Block) -> None:
        self.latencies += block.latencies
        self.first_bytes += block.first_bytes
        self.errors += block.errors
        self.unsent += block.unsent
        self.elapsed += block.elapsed

    @property
    def throughput(self) -> float:
        return len(self.latencies) / self.elapsed if self.elapsed else float("nan")

    def cpu_per_call_us(self, process: str) -> float:
        return self.cpu.get(process, 0.0) / max(1, len(self.latencies)) * 1e6


@dataclass
class LevelResult:
    label: str  # what was measured: "c=8", "stream c=8", "vLLM c=1"
    direct: TargetResult
    gateway: TargetResult
    backlog: int = 0  # most calls answered but not yet recorded, at the end of a gateway block
    lags: list[float | None] = field(default_factory=list)  # per gateway block; None: timed out
    recorded_rates: list[float] = field(default_factory=list)  # calls / (block + its lag), s

    @property
    def lag(self) -> float | None:
        """The longest wait from a gateway block's last answer until every call was recorded."""
        return None if None in self.lags else max(self.lags, default=0.0)


class Processes:
    """The processes whose CPU time is charged to each block."""

    def __init__(self, *, upstream: psutil.Process, gateway: psutil.Process) -> None:
        self.upstream = upstream
        self.gateway = gateway

    def sample(self) -> dict[str, float]:
        return {
            "load generator": time.process_time(),
            "upstream": cpu_seconds(self.upstream),
            "gateway": cpu_seconds(self.gateway),
            "gateway loop": cpu_seconds(self.gateway, event_loops_only=True),
        }


@dataclass
class Target:
    name: str  # "direct" or "gateway"
    url: str  # the chat completions URL
    client: httpx.AsyncClient
    result: TargetResult


def run_level(
    *,
    label: str,
    urls: dict[str, str],
    headers: dict[str, str],
    bodies: list[bytes],
    concurrency: int,
    blocks: int,
    stream: bool,
    timeout: float,
    probe: RecordingProbe,
    processes: Processes | None,
    sent: int,
    deadlines: tuple[float, float],
) -> tuple[LevelResult, int]:
    """Direct and gateway blocks in ABBA order; after each gateway block, wait for recording.

    `sent`: gateway calls of this project so far; returned updated. `deadlines`: per block
    (seconds) and for the whole run (monotonic).
    """
    level = LevelResult(label, TargetResult(), TargetResult())
    phase_timeout, run_deadline = deadlines
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    blocks = max(1, min(blocks, len(bodies)))
    size = -(-len(bodies) // blocks)

    async def run_blocks() -> int:
        calls = sent
        async with (
            httpx.AsyncClient(headers=headers, limits=limits, timeout=timeout) as direct,
            httpx.AsyncClient(headers=headers, limits=limits, timeout=timeout) as gateway,
        ):
            targets = {
                "direct": Target("direct", urls["direct"], direct, level.direct),
                "gateway": Target("gateway", urls["gateway"], gateway, level.gateway),
            }
            # Open the connections and fill the gateway's route cache first; not measured.
            for target in targets.values():
                warm = await send_block(
                    target.client,
                    target.url,
                    bodies[:concurrency],
                    concurrency=concurrency,
                    stream=stream,
                    deadline=time.monotonic() + phase_timeout,
                )
                if warm.errors or warm.unsent:
                    raise RuntimeError(f"{label}: {target.name} failed its warm-up calls")
            calls += concurrency
            if probe.wait_for(calls, time.perf_counter()) is None:
                raise RuntimeError(f"{label}: the warm-up calls were not recorded")

            for number in range(blocks):
                chunk = bodies[number * size : (number + 1) * size]
                order = ("direct", "gateway") if number % 2 == 0 else ("gateway", "direct")
                for target in (targets[name] for name in order):
                    before = processes.sample() if processes else {}
                    block = await send_block(
                        target.client,
                        target.url,
                        chunk,
                        concurrency=concurrency,
                        stream=stream,
                        deadline=min(run_deadline, time.monotonic() + phase_timeout),
                    )
                    after = processes.sample() if processes else {}
                    if target.name == "gateway":
                        calls += len(block.latencies)
                        level.backlog = max(level.backlog, calls - probe.count())
                        lag = probe.wait_for(calls, block.finished_at)
                        level.lags.append(lag)
                        if lag is not None and block.latencies:
                            level.recorded_rates.append(
                                len(block.latencies) / (block.elapsed + lag)
                            )
                        if processes:  # the gateway's bill includes writing the records
                            after["gateway"] = cpu_seconds(processes.gateway)
                            after["gateway loop"] = cpu_seconds(
                                processes.gateway, event_loops_only=True
                            )
                    for name, seconds in after.items():
                        target.result.cpu[name] = target.result.cpu.get(name, 0.0) + (
                            seconds - before[name]
                        )
                    target.result.add(block)
        return calls

    return level, asyncio.run(run_blocks())


# --- the run ----------------------------------------------------------------------------------


@dataclass
class ServerRun:
    """Everything measured against one gateway server."""

    workers: int
    cores: str
    levels: list[LevelResult]
    recorded: int  # ModelCall rows of the project at the end
    sent: int  # calls the gateway answered for the project, warm-ups included
    others_busy: float = float("nan")  # cores kept busy by processes outside the bench, average


def vllm_unavailable(vllm_url: str) -> str:
    """Why the vLLM pass cannot run; "" when it can."""
    try:
        response = httpx.get(f"{vllm_url}/models", timeout=5)
    except httpx.TransportError as error:
        return f"no server at {vllm_url} ({type(error).__name__})"
    if response.status_code != 200:
        return f"{vllm_url}/models answered {response.status_code}"
    served = [model.get("id") for model in orjson.loads(response.content).get("data", [])]
    if VLLM_MODEL not in served:
        return f"{vllm_url} does not serve {VLLM_MODEL} (it serves {served})"
    return ""


def run_server(
    *,
    config: BenchConfig,
    pin: str,
    plan: CorePlan,
    workers: int,
    upstream_url: str,
    upstream: psutil.Process,
    vllm_pass: bool,
    deadline: float,
) -> tuple[ServerRun, ServerRun | None]:
    """Every level against one gateway server; the vLLM pass too when asked."""
    slug = f"bench-{pin}-w{workers}"
    project_id, api_key = create_project_with_key(
        slug=slug, upstream_url=upstream_url, served_model=SERVED_MODEL
    )
    if vllm_pass:
        vllm_project_id, vllm_key = create_project_with_key(
            slug=f"{slug}-vllm", upstream_url=config.vllm_url, served_model=VLLM_MODEL
        )
    headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}
    deadlines = (config.phase_timeout, deadline)
    levels = []
    with running_gateway(
        database_url=config.database_url,
        workers=workers,
        cores=plan.gateway,
        api_key=api_key,
        ports=config.ports,
    ) as (base_url, gateway):
        urls = {
            "direct": f"{upstream_url}/chat/completions",
            "gateway": f"{base_url}/v1/chat/completions",
        }
        processes = Processes(upstream=upstream, gateway=gateway)
        probe = RecordingProbe(config.database_url, project_id)
        sent = 0
        machine_before, ours_before, started = _busy_seconds(), processes.sample(), time.monotonic()
        try:
            streamed = (
                f"stream c={STREAM_CONCURRENCY}",
                STREAM_CONCURRENCY,
                config.stream_requests,
            )
            passes = [(f"c={level}", level, config.requests) for level in config.concurrency]
            passes = [(*fast, False) for fast in passes] + [(*streamed, True)]
            for label, concurrency, count, stream in passes:
                if time.monotonic() > deadline:
                    print(f"  skipped {label}: --max-seconds reached", flush=True)
                    continue
                print(f"  {slug}: {label} ...", flush=True)
                level, sent = run_level(
                    label=label,
                    urls=urls,
                    headers={**headers, **PROXY_HEADERS},
                    bodies=chat_bodies(count, model=SERVED_MODEL, offset=sent, stream=stream),
                    concurrency=concurrency,
                    blocks=config.blocks,
                    stream=stream,
                    timeout=REQUEST_TIMEOUT_S,
                    probe=probe,
                    processes=processes,
                    sent=sent,
                    deadlines=deadlines,
                )
                levels.append(level)
            recorded = probe.count()
            ours = sum(processes.sample().values()) - sum(ours_before.values())
            others = (_busy_seconds() - machine_before - ours) / (time.monotonic() - started)
        finally:
            probe.close()
        fast = ServerRun(workers, plan.describe(), levels, recorded, sent, others)
        if not vllm_pass:
            return fast, None
        return fast, run_vllm(
            config=config,
            base_url=base_url,
            project_id=vllm_project_id,
            api_key=vllm_key,
            workers=workers,
            cores=plan.describe(),
            deadline=deadline,
        )


def run_vllm(
    *,
    config: BenchConfig,
    base_url: str,
    project_id: int,
    api_key: str,
    workers: int,
    cores: str,
    deadline: float,
) -> ServerRun:
    """A short pass against vLLM: a real model's latency, with and without the gateway."""
    headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}
    urls = {
        "direct": f"{config.vllm_url}/chat/completions",
        "gateway": f"{base_url}/v1/chat/completions",
    }
    probe = RecordingProbe(config.database_url, project_id)
    sent, levels = 0, []
    try:
        for concurrency in VLLM_CONCURRENCY:
            if time.monotonic() > deadline:
                print(f"  skipped vLLM c={concurrency}: --max-seconds reached", flush=True)
                continue
            print(f"  vLLM c={concurrency} ...", flush=True)
            level, sent = run_level(
                label=f"vLLM c={concurrency}",
                urls=urls,
                headers={**headers, **PROXY_HEADERS},
                bodies=chat_bodies(
                    config.vllm_requests,
                    model=VLLM_MODEL,
                    offset=sent,
                    max_tokens=VLLM_MAX_TOKENS,
                    temperature=0,
                ),
                concurrency=concurrency,
                blocks=2,  # few calls: D G G D still cancels a linear drift
                stream=False,
                timeout=VLLM_REQUEST_TIMEOUT_S,
                probe=probe,
                processes=None,
                sent=sent,
                deadlines=(config.phase_timeout, deadline),
            )
            levels.append(level)
        recorded = probe.count()
    finally:
        probe.close()
    return ServerRun(workers, cores, levels, recorded, sent)


def run(config: BenchConfig, deadline: float) -> tuple[list[ServerRun], ServerRun | None, str]:
    """Every (pinning, workers) combination; the vLLM pass with the first server."""
    all_cores = os.sched_getaffinity(0)
    skipped = "--vllm-requests 0" if not config.vllm_requests else vllm_unavailable(config.vllm_url)
    runs, vllm_run = [], None
    try:
        for pin in config.pin:
            plan = core_plan(pin, all_cores)
            os.sched_setaffinity(0, plan.load_generator or all_cores)
            lifetime = max(60.0, deadline - time.monotonic() + 60)
            with running_upstream(
                cores=plan.upstream, lifetime=lifetime, ports=config.ports
            ) as upstream_url:
                upstream = psutil.Process(_listener_pid(upstream_url))
                for workers in config.workers:
                    if time.monotonic() > deadline:
                        print(f"skipped workers={workers}, pin={pin}: --max-seconds reached")
                        continue
                    fast, vllm = run_server(
                        config=config,
                        pin=pin,
                        plan=plan,
                        workers=workers,
                        upstream_url=upstream_url,
                        upstream=upstream,
                        vllm_pass=not skipped and vllm_run is None,
                        deadline=deadline,
                    )
                    runs.append(fast)
                    vllm_run = vllm_run or vllm
    finally:
        os.sched_setaffinity(0, all_cores)
    return runs, vllm_run, skipped


def _busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy (every core, every process)."""
    times = psutil.cpu_times()
    return times.user + times.nice + times.system + times.irq + times.softirq + times.steal


def _listener_pid(url: str) -> int:
    """The process listening on the URL's port (the upstream child)."""
    port = urlsplit(url).port
    for connection in psutil.net_connections(kind="tcp"):
        if connection.laddr and connection.laddr.port == port and connection.status == "LISTEN":
            return connection.pid
    raise RuntimeError(f"nothing listens on port {port}")


# --- report -----------------------------------------------------------------------------------

# Issue 16, against the fast upstream: added p50 at c=1 and throughput at c=8 (checked at every
# level here), and the gateway's CPU per call (GOAL_GATEWAY_CPU_MS, read off the CPU table).
GOAL_ADDED_P50_MS = 3.0
GOAL_THROUGHPUT_RATIO = 0.5
GOAL_GATEWAY_CPU_MS = 2.0


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.2f}"


def _latency_cells(direct: list[float], gateway: list[float]) -> str:
    """p50 and p99 in ms: direct, through the gateway, and the difference."""
    cells = ""
    for share, width in ((0.5, 16), (0.99, 16)):
        ours, theirs = percentile(gateway, share), percentile(direct, share)
        cells += f"{_ms(theirs):>{width}}{_ms(ours):>9}{_ms(ours - theirs):>9}"
    return cells


def report_run(run: ServerRun, *, with_cpu: bool) -> None:
    print(f"\ngateway: uvicorn --workers {run.workers}; {run.cores}")
    if run.others_busy == run.others_busy:  # not NaN
        print(
            f"  meanwhile processes outside this bench (and PostgreSQL) kept {run.others_busy:.2f}"
            f" of {os.cpu_count()} cores busy on average"
        )
    print(
        f"  {'level':<12}{'n':>6}{'p50 ms: direct':>16}{'gateway':>9}{'added':>9}"
        f"{'p99 ms: direct':>16}{'gateway':>9}{'added':>9}{'req/s: direct':>15}{'gateway':>9}"
        f"{'ratio':>7}{'goals':>7}"
    )
    for level in run.levels:
        direct, gateway = level.direct, level.gateway
        added = percentile(gateway.latencies, 0.5) - percentile(direct.latencies, 0.5)
        ratio = gateway.throughput / direct.throughput
        goals = ("ok" if added * 1000 <= GOAL_ADDED_P50_MS else "--") + (
            "ok" if ratio >= GOAL_THROUGHPUT_RATIO else "--"
        )
        print(
            f"  {level.label:<12}{len(gateway.latencies):>6}"
            + _latency_cells(direct.latencies, gateway.latencies)
            + f"{direct.throughput:>15.0f}{gateway.throughput:>9.0f}{ratio:>7.2f}{goals:>7}"
        )
        if direct.unsent or gateway.unsent:
            print(f"    ({direct.unsent} direct, {gateway.unsent} gateway calls not sent: time)")
        if direct.first_bytes:
            print(
                f"  {'first byte':<18}"
                + _latency_cells(direct.first_bytes, gateway.first_bytes)
                + "   (the row above: the whole stream)"
            )
    print(
        f"  {'level':<12}"
        + (
            f"{'CPU µs/call direct: client':>28}{'upstream':>9}{'| gateway: client':>18}"
            f"{'upstream':>9}{'gateway':>9}{'(loop':>7}{'other)':>8}"
            if with_cpu
            else ""
        )
        + f"{'backlog':>9}{'lag ms':>9}{'rec/s':>7}{'errors':>8}"
    )
    for level in run.levels:
        direct, gateway = level.direct, level.gateway
        line = f"  {level.label:<12}"
        loop = gateway.cpu_per_call_us("gateway loop")
        if with_cpu:
            line += (
                f"{direct.cpu_per_call_us('load generator'):>28.0f}"
                f"{direct.cpu_per_call_us('upstream'):>9.0f}"
                f"{gateway.cpu_per_call_us('load generator'):>18.0f}"
                f"{gateway.cpu_per_call_us('upstream'):>9.0f}"
                f"{gateway.cpu_per_call_us('gateway'):>9.0f}"
                f"{loop:>7.0f}{gateway.cpu_per_call_us('gateway') - loop:>8.0f}"
            )
        rate = min(level.recorded_rates, default=float("nan"))
        line += (
            f"{level.backlog:>9}{_ms(level.lag):>9}{rate:>7.0f}{direct.errors + gateway.errors:>8}"
        )
        print(line)
    state = "all recorded" if run.recorded >= run.sent else "MISSING RECORDS"
    print(f"  recording: {run.recorded} ModelCall rows for {run.sent} answered calls ({state})")


def report(
    config: BenchConfig, runs: list[ServerRun], vllm: ServerRun | None, skipped: str
) -> None:
    print(
        f"\ngateway overhead: {config.requests} calls per target and level "
        f"({config.blocks} alternating blocks), {config.stream_requests} streamed; "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}. The load generator "
        "(httpx, this process), the fast upstream, the gateway and PostgreSQL share these cores."
    )
    print(
        f"goals: added p50 <= {GOAL_ADDED_P50_MS:g} ms and throughput >= "
        f"{GOAL_THROUGHPUT_RATIO:g}x direct ('goals': ok/-- for each), gateway CPU <= "
        f"{GOAL_GATEWAY_CPU_MS * 1000:g} µs/call. CPU µs/call: CPU time each "
        "process spent during that target's blocks / calls; the gateway's includes writing the "
        "records (loop: its event loop thread, serving the calls; other: its other threads, "
        "the recorder's). backlog: calls answered but not yet recorded when a block ended; lag: "
        "from a block's last answer until all were recorded (worst block); rec/s: calls "
        "answered and recorded per second, block time + lag (worst block)."
    )
    for run in runs:
        report_run(run, with_cpu=True)
    if vllm is None:
        print(f"\nvLLM pass skipped: {skipped}")
    else:
        print(
            f"\nvLLM ({config.vllm_url}, {VLLM_MODEL}, max_tokens {VLLM_MAX_TOKENS}, "
            f"{config.vllm_requests} calls per target and level):"
        )
        report_run(vllm, with_cpu=False)


def main() -> None:
    if sys.argv[1:2] == ["--serve-upstream"]:
        serve_upstream(int(sys.argv[2]), float(sys.argv[3]))
        return
    config = parse_args()
    deadline = time.monotonic() + config.max_seconds
    with scratch_database(config.admin_url, BENCH_DATABASE):
        setup_django(config.database_url)
        runs, vllm, skipped = run(config, deadline)
    report(config, runs, vllm, skipped)


if __name__ == "__main__":
    main()
