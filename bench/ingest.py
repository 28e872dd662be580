"""Ingest throughput: the HTTP API against a PostgreSQL COPY of the same rows, and where time goes.

Run from the repository root, with PostgreSQL reachable (see bench/README.md):

    python bench/ingest.py --traces 2000 --batch 200 --concurrency 2 --workers 2

It creates a scratch database, starts the real ASGI app under uvicorn and posts synthetic agent
traces in batches; then loads exactly the rows the API stored into an empty copy of the table
with COPY; then times the same work in-process, stage by stage, each time on a fresh project.
Every measurement is repeated (--repeat) and the median is reported: the machine is shared.
"""

import argparse
import gc
import os
import random
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import orjson
import psycopg
from apprentice_server import (
    SERVER_SECRET_KEY,
    free_port,
    server_command,
    server_environment,
    stop_server,
)
from psycopg import sql
from scratch_db import add_admin_url_argument, scratch_database, scratch_database_url

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))  # `python bench/ingest.py` puts bench/, not the root, first

BENCH_DATABASE = "apprentice_bench_ingest"
REQUEST_TIMEOUT_S = 120.0  # one batch; a server that takes longer is broken, not slow
SERVER_START_TIMEOUT_S = 60.0
# DEBUG off makes Django redirect plain HTTP to HTTPS; in production a TLS proxy sends this header.
PROXY_HEADERS = {"X-Forwarded-Proto": "https"}


@dataclass(frozen=True)
class BenchConfig:
    traces: int  # how many traces one run ingests
    batch: int  # traces per POST
    concurrency: int  # requests in flight at once
    workers: int  # uvicorn worker processes
    repeat: int  # runs of every measurement; the median is reported
    seed: int  # the synthetic traces are the same for the same seed
    admin_url: str  # an existing database to CREATE and DROP the scratch database from

    def __post_init__(self):
        for name in ("traces", "batch", "concurrency", "workers", "repeat"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} must be at least 1")

    @property
    def database_url(self) -> str:
        return scratch_database_url(self.admin_url, BENCH_DATABASE)


def parse_args() -> BenchConfig:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    add_admin_url_argument(parser)
    return BenchConfig(**vars(parser.parse_args()))


# --- synthetic traces -------------------------------------------------------------------------

VOCABULARY = (
    "the a of to in is that for it with as on be this are by from or file function test error "
    "value return request module config path line import class method result output check "
    "build run install version update fix change missing expected found failed passed user "
    "data query table index column row cache server client token timeout retry response status"
)
WORDS = VOCABULARY.split()

TOOLS = {
    "search_code": ("Search the repository for a regular expression.", ["pattern", "path"]),
    "read_file": ("Read a file, optionally a range of lines.", ["path", "start", "end"]),
    "edit_file": ("Replace one exact string in a file with another.", ["path", "old", "new"]),
    "run_tests": ("Run the test suite or a subset of it.", ["selector"]),
    "list_directory": ("List the entries of a directory.", ["path"]),
    "run_command": ("Run a shell command in the sandbox and return its output.", ["command"]),
}

MESSAGES_PER_TRACE = 20  # about: the last tool-calling turn may add one more


def _text(rng: random.Random, size: int) -> str:
    """About `size` bytes of word salad."""
    return " ".join(rng.choices(WORDS, k=max(1, size // 5)))


def _tool_definitions() -> list[dict]:
    return [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": description,
                "parameters": {
                    "type": "object",
                    "properties": {argument: {"type": "string"} for argument in arguments},
                    "required": arguments[:1],
                },
            },
        }
        for name, (description, arguments) in TOOLS.items()
    ]


def make_trace(rng: random.Random, index: int, tools: list[dict]) -> dict:
    """An agent episode: system, user, tool-calling turns with their results, a final answer."""
    messages: list[dict] = [
        {"role": "system", "content": _text(rng, 800)},
        {"role": "user", "content": _text(rng, rng.randint(150, 500))},
    ]
    call_number = 0
    while len(messages) < MESSAGES_PER_TRACE - 3:
        calls = []
        for _ in range(rng.choice((1, 1, 2))):
            call_number += 1
            name = rng.choice(list(TOOLS))
            arguments = {argument: _text(rng, 30) for argument in TOOLS[name][1]}
            calls.append(
                {
                    "id": f"call_{index}_{call_number}",
                    "type": "function",
                    "function": {"name": name, "arguments": orjson.dumps(arguments).decode()},
                }
            )
        thought = _text(rng, rng.randint(50, 250)) if rng.random() < 0.6 else None
        messages.append({"role": "assistant", "content": thought, "tool_calls": calls})
        for call in calls:
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": call["id"],
                    "content": _text(rng, rng.randint(200, 900)),
                }
            )
    messages.append({"role": "assistant", "content": _text(rng, rng.randint(200, 600))})
    started_at = datetime(2025, 1, 1, tzinfo=UTC) + timedelta(seconds=rng.randint(0, 30_000_000))
    return {
        "external_id": f"bench-{index:07d}",
        "model": "SmolLM2-135M-Instruct",
        "messages": messages,
        "tools": tools,
        "metadata": {"customer": f"c-{rng.randint(1, 500)}", "harness": "bench", "attempt": 1},
        "termination": rng.choice(
            ("completed", "completed", "completed", "max_steps", "tool_error")
        ),
        "outcome": {"reward": round(rng.random(), 3), "success": rng.random() < 0.7},
        "started_at": started_at.isoformat(),
        "ended_at": (started_at + timedelta(seconds=rng.randint(5, 600))).isoformat(),
        "usage": {
            "prompt_tokens": rng.randint(2000, 30000),
            "completion_tokens": rng.randint(100, 3000),
        },
    }


def make_request_bodies(config: BenchConfig) -> tuple[list[bytes], int]:
    """The POST bodies, one per batch, and how many messages they hold in all."""
    rng = random.Random(config.seed)
    tools = _tool_definitions()
    traces = [make_trace(rng, index, tools) for index in range(config.traces)]
    bodies = [
        orjson.dumps({"traces": traces[start : start + config.batch]})
        for start in range(0, len(traces), config.batch)
    ]
    return bodies, sum(len(trace["messages"]) for trace in traces)


# --- the scratch database ---------------------------------------------------------------------


def setup_django(database_url: str) -> None:
    """Point Django at the scratch database (settings read the environment once, at setup)."""
    os.environ["DATABASE_URL"] = database_url
    os.environ["DJANGO_SETTINGS_MODULE"] = "reviewapp.settings"
    # As the server runs; DEBUG on would also keep every query in memory.
    os.environ["DJANGO_DEBUG"] = "false"
    os.environ["DJANGO_SECRET_KEY"] = SERVER_SECRET_KEY
    os.environ["DJANGO_ALLOWED_HOSTS"] = "testserver"  # the test client's host
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    import reviewapp.urls  # noqa: F401  (loaded now, as a server has it before the first request)


def create_project_with_key(slug: str) -> tuple[Any, str]:
    from reviewapp.projects.services import create_api_key, create_project

    project = create_project(slug=slug)
    _, secret = create_api_key(project=project, name="bench")
    return project, secret


# --- clocks -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Span:
    """What a measurement took: wall-clock seconds and CPU seconds of the processes doing it.

    On a shared machine the wall clock includes waiting for other people's work; CPU does not.
    """

    wall: float
    cpu: float

    def __add__(self, other: "Span") -> "Span":
        return Span(self.wall + other.wall, self.cpu + other.cpu)

    def __sub__(self, other: "Span") -> "Span":
        return Span(self.wall - other.wall, self.cpu - other.cpu)


class Stopwatch:
    """Started on creation; `cpu_clock` is this process's CPU time unless another is given."""

    def __init__(self, cpu_clock: Callable[[], float] = time.process_time):
        self.cpu_clock = cpu_clock
        self.wall_start = time.perf_counter()
        self.cpu_start = cpu_clock()

    def elapsed(self) -> Span:
        return Span(time.perf_counter() - self.wall_start, self.cpu_clock() - self.cpu_start)


def _process_tree_cpu_seconds(pid: int) -> float:
    """CPU seconds used so far by a process and its live descendants (Linux /proc)."""
    ticks_per_second = os.sysconf("SC_CLK_TCK")
    total = 0.0
    pending = [pid]
    while pending:
        current = pending.pop()
        try:
            stat = Path(f"/proc/{current}/stat").read_text()
            children = Path(f"/proc/{current}/task/{current}/children").read_text()
        except FileNotFoundError:  # it exited between the two reads
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        total += (int(fields[11]) + int(fields[12])) / ticks_per_second  # utime + stime
        pending.extend(int(child) for child in children.split())
    return total


# --- the API over HTTP ------------------------------------------------------------------------


@dataclass(frozen=True)
class Server:
    base_url: str
    pid: int

    def cpu_seconds(self) -> float:
        """CPU used so far by uvicorn and its worker processes."""
        return _process_tree_cpu_seconds(self.pid)


@contextmanager
def running_server(*, database_url: str, workers: int, api_key: str) -> Iterator[Server]:
    """uvicorn serving the app in a subprocess, answering; stopped on exit."""
    port = free_port()
    environment = server_environment(database_url)
    command = server_command(port, workers)
    process = subprocess.Popen(command, cwd=REPO_ROOT, env=environment)
    server = Server(base_url=f"http://127.0.0.1:{port}", pid=process.pid)
    try:
        _wait_until_up(process, server.base_url, api_key)
        yield server
    finally:
        stop_server(process)


def _wait_until_up(process: subprocess.Popen, base_url: str, api_key: str) -> None:
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    headers = {"Authorization": f"Bearer {api_key}", **PROXY_HEADERS}
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"uvicorn exited with status {process.returncode} before answering")
        try:
            response = httpx.get(f"{base_url}/api/v1/traces?limit=1", headers=headers, timeout=2)
        except httpx.TransportError:
            time.sleep(0.2)
            continue
        if response.status_code == 200:
            return
        raise RuntimeError(f"the server answered {response.status_code}: {response.text[:300]}")
    raise RuntimeError(f"the server did not answer within {SERVER_START_TIMEOUT_S:.0f}s")


def post_batches(*, server: Server, api_key: str, bodies: list[bytes], concurrency: int) -> Span:
    """POST every body and check each item was created.

    Wall: first request to last response. CPU: the server's, not this client's.
    """
    headers = {
        "Authorization": f"Bearer {api_key}",
        "Content-Type": "application/json",
        **PROXY_HEADERS,
    }
    limits = httpx.Limits(max_connections=concurrency)
    with (
        httpx.Client(
            base_url=server.base_url, headers=headers, timeout=REQUEST_TIMEOUT_S, limits=limits
        ) as client,
        ThreadPoolExecutor(max_workers=concurrency) as pool,
    ):

        def post(body: bytes) -> list[dict]:
            response = client.post("/api/v1/traces", content=body)
            if response.status_code != 207:
                raise RuntimeError(f"POST answered {response.status_code}: {response.text[:300]}")
            return orjson.loads(response.content)["results"]

        stopwatch = Stopwatch(cpu_clock=server.cpu_seconds)
        batches = list(pool.map(post, bodies))
        span = stopwatch.elapsed()
    _check_all_created([result["status"] for batch in batches for result in batch], bodies)
    return span


def _check_all_created(statuses: list[int], bodies: list[bytes]) -> None:
    expected = sum(body.count(b'"external_id":') for body in bodies)
    created = statuses.count(201)
    if len(statuses) != expected or created != expected:
        raise RuntimeError(f"{created} of {expected} items were created ({len(statuses)} results)")


# --- the baseline: COPY the same rows ---------------------------------------------------------


def copy_baseline(*, database_url: str, project_id: int, table: str) -> Span:
    """Load the rows the API stored into a new empty table shaped like reviewapp_trace.

    CPU: this client's and its PostgreSQL backend's.
    """
    with psycopg.connect(database_url) as connection:
        columns = connection.execute(
            "SELECT attname, atttypid::regtype::text FROM pg_attribute"
            " WHERE attrelid = 'reviewapp_trace'::regclass AND attnum > 0 AND NOT attisdropped"
            " ORDER BY attnum"
        ).fetchall()
        names = sql.SQL(", ").join(sql.Identifier(name) for name, _ in columns)
        rows = connection.execute(
            sql.SQL("SELECT {} FROM reviewapp_trace WHERE project_id = %s ORDER BY id").format(
                names
            ),
            (project_id,),
        ).fetchall()
        # LIKE brings the indexes and the unique constraint; the foreign key is added by hand so
        # COPY checks what our inserts check.
        connection.execute(
            sql.SQL("CREATE TABLE {} (LIKE reviewapp_trace INCLUDING ALL)").format(
                sql.Identifier(table)
            )
        )
        connection.execute(
            sql.SQL(
                "ALTER TABLE {} ADD FOREIGN KEY (project_id) REFERENCES reviewapp_project (id)"
                " DEFERRABLE INITIALLY DEFERRED"
            ).format(sql.Identifier(table))
        )
        connection.commit()

        statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(
            sql.Identifier(table), names
        )
        backend_pid = connection.info.backend_pid
        stopwatch = Stopwatch(
            cpu_clock=lambda: time.process_time() + _process_tree_cpu_seconds(backend_pid)
        )
        with connection.cursor() as cursor, cursor.copy(statement) as copy:
            copy.set_types([type_name for _, type_name in columns])
            for row in rows:
                copy.write_row(row)
        connection.commit()
        span = stopwatch.elapsed()

        count = sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))
        copied = connection.execute(count).fetchone()[0]
    if copied != len(rows):
        raise RuntimeError(f"COPY stored {copied} rows, expected {len(rows)}")
    return span


# --- where the time goes, in-process ----------------------------------------------------------


def time_django_handler(*, bodies: list[bytes], slug: str, collector: str) -> Span:
    """POST every body through Django's handler with the test client: no socket, no ASGI.

    `collector`: "on" as a server runs; "frozen": the objects alive now (Django, the app, its
    imports) out of the collector's reach first, as `gc.freeze()` after startup does; "off".
    """
    from django.test import Client

    _, api_key = create_project_with_key(slug)
    client = Client(headers={"Authorization": f"Bearer {api_key}"})
    gc.collect()
    if collector == "frozen":
        gc.freeze()
    elif collector == "off":
        gc.disable()
    statuses = []
    stopwatch = Stopwatch()
    for body in bodies:
        response = client.post("/api/v1/traces", body, content_type="application/json", secure=True)
        if response.status_code != 207:
            raise RuntimeError(f"POST answered {response.status_code}: {response.content[:300]}")
        statuses.extend(result["status"] for result in orjson.loads(response.content)["results"])
    span = stopwatch.elapsed()
    gc.enable()
    gc.unfreeze()
    _check_all_created(statuses, bodies)
    return span


def time_stages(*, bodies: list[bytes], slug: str) -> dict[str, Span]:
    """Each ingest stage over all batches, one batch at a time, with the garbage collector off.

    The collector's share is measured on the whole handler (`time_django_handler`).
    """
    from django.conf import settings
    from django.db import connection

    from reviewapp.traces.chat import parse_trace_item
    from reviewapp.traces.ingest import content_hash_of, ingest_traces
    from reviewapp.traces.models import Trace

    project, _ = create_project_with_key(slug)
    batches = [orjson.loads(body)["traces"] for body in bodies]
    connection.ensure_connection()
    backend_pid = connection.connection.info.backend_pid
    gc.collect()
    gc.disable()

    def validate(batch: list[dict]) -> list:
        return [
            parse_trace_item(
                raw,
                max_depth=settings.INGEST_MAX_NESTING_DEPTH,
                max_messages=settings.INGEST_MAX_MESSAGES_PER_TRACE,
            )
            for raw in batch
        ]

    def hash_and_pack(batch: list[dict]) -> list:
        return [
            (
                content_hash_of(raw),
                Trace.pack_body(messages=raw["messages"], tools=raw.get("tools") or []),
            )
            for raw in batch
        ]

    def ingest(batch: list[dict]) -> None:
        results = ingest_traces(project=project, raw_items=batch)
        if any(result.status != 201 for result in results):
            raise RuntimeError("the in-process ingest did not create every item")

    sql_total = Span(0.0, 0.0)

    def time_sql(execute, statement, params, many, context):
        nonlocal sql_total
        stopwatch = Stopwatch()
        try:
            return execute(statement, params, many, context)
        finally:
            sql_total += stopwatch.elapsed()

    stages = {
        "parse": _timed_per_input(orjson.loads, bodies),
        "validate": _timed_per_input(validate, batches),
        "hash_and_pack": _timed_per_input(hash_and_pack, batches),
    }
    backend_cpu_start = _process_tree_cpu_seconds(backend_pid)
    with connection.execute_wrapper(time_sql):
        stages["service"] = _timed_per_input(ingest, batches)
    stages["sql"] = sql_total
    # The backend's CPU is inside the SQL wall clock; it has no wall clock of its own.
    stages["postgres"] = Span(0.0, _process_tree_cpu_seconds(backend_pid) - backend_cpu_start)
    gc.enable()
    return stages


def _timed_per_input(action: Callable[[Any], object], inputs: list) -> Span:
    stopwatch = Stopwatch()
    for value in inputs:
        action(value)
    return stopwatch.elapsed()


# --- the run ----------------------------------------------------------------------------------


def run(config: BenchConfig, bodies: list[bytes]) -> dict[str, list[Span]]:
    """Every measurement, `config.repeat` times, each on a fresh project."""
    from django.db import connections

    runs: dict[str, list[Span]] = defaultdict(list)
    projects = [create_project_with_key(f"bench-http-{number}") for number in range(config.repeat)]
    connections.close_all()  # the server gets the database to itself
    with running_server(
        database_url=config.database_url, workers=config.workers, api_key=projects[0][1]
    ) as server:
        for _, api_key in projects:
            runs["api"].append(
                post_batches(
                    server=server, api_key=api_key, bodies=bodies, concurrency=config.concurrency
                )
            )
    for number, (project, _) in enumerate(projects):
        table = f"bench_trace_copy_{number}"
        runs["copy"].append(
            copy_baseline(database_url=config.database_url, project_id=project.pk, table=table)
        )
    for number in range(config.repeat):
        for collector in ("on", "frozen", "off"):
            slug = f"bench-handler-{collector}-{number}"
            runs[f"handler_gc_{collector}"].append(
                time_django_handler(bodies=bodies, slug=slug, collector=collector)
            )
        for name, span in time_stages(bodies=bodies, slug=f"bench-stages-{number}").items():
            runs[name].append(span)
    connections.close_all()
    return runs


# --- report -----------------------------------------------------------------------------------


def _median(spans: list[Span]) -> Span:
    return Span(
        statistics.median(span.wall for span in spans),
        statistics.median(span.cpu for span in spans),
    )


def report(
    *, config: BenchConfig, messages: int, body_bytes: int, runs: dict[str, list[Span]]
) -> None:
    median = {name: _median(spans) for name, spans in runs.items()}
    api, copy = median["api"], median["copy"]
    print(
        f"\ningest: {config.traces} traces, {messages:,} messages, {body_bytes / 1e6:.1f} MB of "
        f"JSON; batch {config.batch}, concurrency {config.concurrency}, uvicorn workers "
        f"{config.workers}; {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}; "
        f"median of {config.repeat}"
    )
    print(f"  {'path':<44}{'wall s':>8}{'messages/s':>12}{'CPU s':>8}   wall s of each run")
    for label, name, whose_cpu in (
        ("HTTP API, first request to last response", "api", "the server's"),
        ("COPY of the same rows (binary)", "copy", "client + PostgreSQL"),
    ):
        each = " ".join(f"{span.wall:.3f}" for span in runs[name])
        span = median[name]
        print(
            f"  {label:<44}{span.wall:>8.3f}{messages / span.wall:>12,.0f}{span.cpu:>8.3f}"
            f"   {each}  (CPU: {whose_cpu})"
        )
    print(f"  ratio ours / COPY: {copy.wall / api.wall:.3f} (goal >= 0.3)")
    # Other people's work on a shared machine moves the wall clock, not the CPU seconds.
    ours_cpu = api.cpu + median["postgres"].cpu
    print(
        f"  ratio by CPU, COPY / (server + PostgreSQL for our inserts): {copy.cpu / ours_cpu:.3f}"
        f" ({copy.cpu:.3f}s / {ours_cpu:.3f}s; PostgreSQL's share measured in-process below)"
    )

    handler = median["handler_gc_on"]
    service_work = median["parse"] + median["service"]
    rest_of_service = (
        median["service"] - median["validate"] - median["hash_and_pack"] - median["sql"]
    )
    rows = [
        ("JSON parse of the request bodies (orjson)", median["parse"]),
        ("validation (parse_trace_item)", median["validate"]),
        ("content hash + compress body", median["hash_and_pack"]),
        ("SQL statements (wall includes PostgreSQL)", median["sql"]),
        ("rest of ingest_traces (rows, facts, COPY)", rest_of_service),
        ("Django, ninja, middleware, auth, response", median["handler_gc_off"] - service_work),
        (
            "garbage collector: the request's objects",
            median["handler_gc_frozen"] - median["handler_gc_off"],
        ),
        ("garbage collector: the startup heap", handler - median["handler_gc_frozen"]),
    ]
    print("\nwhere the time goes (in-process, one thread, all batches; CPU: this process):")
    print(f"  {'stage':<44}{'CPU s':>8}{'share':>8}{'wall s':>8}")
    for label, span in rows:
        print(f"  {label:<44}{span.cpu:>8.3f}{span.cpu / handler.cpu:>8.0%}{span.wall:>8.3f}")
    label = "= Django handler (test client, no socket)"
    print(f"  {label:<44}{handler.cpu:>8.3f}{1:>8.0%}{handler.wall:>8.3f}")
    label = "PostgreSQL backend for those statements"
    print(f"  {label:<44}{median['postgres'].cpu:>8.3f}   (its time is inside the SQL wall)")


def main() -> None:
    config = parse_args()
    bodies, messages = make_request_bodies(config)
    with scratch_database(config.admin_url, BENCH_DATABASE):
        setup_django(config.database_url)
        runs = run(config, bodies)
    report(
        config=config,
        messages=messages,
        body_bytes=sum(len(body) for body in bodies),
        runs=runs,
    )


if __name__ == "__main__":
    main()
