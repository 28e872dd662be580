"""Load on ingest and the gateway at several concurrencies, past the admission limits on purpose.

What one run does (127.0.0.1 only, every request with a timeout, the whole run bounded):

1. Creates a scratch PostgreSQL database, a project whose upstream is the fast fake model server
   of bench/gateway.py (in its own process), and an API key.
2. Starts the web process as production runs it (uvicorn, DJANGO_DEBUG=false) with the
   admission limits `--ingest-limit` and `--gateway-limit` requests in flight.
3. For each concurrency in `--concurrency`, sends `--requests` ingest batches of `--batch`
   traces, then `--requests` gateway calls, that many in flight at once. Levels above the limits
   are the overload: the answer there must be 503 + Retry-After at once, not a timeout.
4. Prints per level: answered per second, p50 and p99 latency, and how many got 503 (with and
   without Retry-After), other errors and timeouts; throughput is also given as a ratio to the
   lowest level, the baseline measured in the same run.
5. Counts the rows: every trace acknowledged 201 must be stored (and nothing else), every
   gateway call answered must be recorded once the recorder catches up.

    python bench/load.py --concurrency 1,4,16,64 --requests 200 --batch 20
"""

import argparse
import asyncio
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))  # `python bench/load.py` puts bench/, not the root, first

from apprentice_server import free_port, server_command, server_environment  # noqa: E402
from gateway import (  # noqa: E402
    PROXY_HEADERS,
    create_project_with_key,
    percentile,
    running_process,
    running_upstream,
    setup_django,
)
from scratch_db import drop_database, recreate_database  # noqa: E402

BENCH_DATABASE = "apprentice_bench_load"
SERVED_MODEL = "bench-agent"
REQUEST_TIMEOUT_S = 30.0  # a client's patience; an answer this late counts as a timeout
RECORDING_TIMEOUT_S = 60.0


@dataclass
class Level:
    path: str
    concurrency: int
    latencies: list[float] = field(default_factory=list)  # answered 207 / 200
    refused_latencies: list[float] = field(default_factory=list)  # answered 503
    statuses: Counter = field(default_factory=Counter)
    refused_without_retry_after: int = 0
    timeouts: int = 0
    elapsed: float = 0.0
    acknowledged: set[str] = field(default_factory=set)  # trace ids answered 201

    @property
    def answered(self) -> int:
        return sum(self.statuses.values())

    def row(self, baseline: float) -> str:
        ok = self.statuses.get(207 if self.path == "ingest" else 200, 0)
        rate = ok / self.elapsed if self.elapsed else 0.0
        ratio = f"{rate / baseline:5.2f}x" if baseline else "    -"  # vs the lowest level
        refused = self.statuses.get(503, 0)
        others = self.answered - ok - refused
        return (
            f"{self.path:8} c={self.concurrency:<4} {rate:8.1f} ok/s {ratio}  "
            f"p50 {percentile(self.latencies, 0.5) * 1000:7.1f} ms  "
            f"p99 {percentile(self.latencies, 0.99) * 1000:7.1f} ms  "
            f"503 {refused:4} (p99 {percentile(self.refused_latencies, 0.99) * 1000:6.1f} ms, "
            f"no Retry-After: {self.refused_without_retry_after})  "
            f"other {others:3}  timeouts {self.timeouts}"
        )

    def ok_rate(self) -> float:
        ok = self.statuses.get(207 if self.path == "ingest" else 200, 0)
        return ok / self.elapsed if self.elapsed else 0.0


def ingest_body(level: int, number: int, batch: int) -> dict:
    return {
        "traces": [
            {
                "external_id": f"c{level}-r{number}-t{index}",
                "messages": [
                    {"role": "user", "content": f"request {number}, trace {index}"},
                    {"role": "assistant", "content": "done"},
                ],
                "metadata": {"bench": "load"},
            }
            for index in range(batch)
        ]
    }


CHAT_BODY = {"model": SERVED_MODEL, "messages": [{"role": "user", "content": "hello"}]}


async def run_level(
    client: httpx.AsyncClient, base_url: str, path: str, concurrency: int, args
) -> Level:
    level = Level(path, concurrency)
    numbers = iter(range(args.requests))

    async def one_worker() -> None:
        for number in numbers:
            if path == "ingest":
                url, body = (
                    f"{base_url}/api/v1/traces",
                    ingest_body(concurrency, number, args.batch),
                )
            else:
                url, body = f"{base_url}/v1/chat/completions", CHAT_BODY
            started = time.perf_counter()
            try:
                response = await client.post(url, json=body)
            except httpx.TimeoutException:
                level.timeouts += 1
                continue
            except httpx.TransportError:
                level.statuses["connection error"] += 1
                continue
            seconds = time.perf_counter() - started
            level.statuses[response.status_code] += 1
            if response.status_code in (200, 207):
                level.latencies.append(seconds)
            elif response.status_code == 503:
                level.refused_latencies.append(seconds)
            if response.status_code == 503 and "retry-after" not in response.headers:
                level.refused_without_retry_after += 1
            if path == "ingest" and response.status_code == 207:
                level.acknowledged.update(
                    result["external_id"]
                    for result in response.json()["results"]
                    if result["status"] == 201
                )

    started = time.perf_counter()
    await asyncio.gather(*(one_worker() for _ in range(concurrency)))
    level.elapsed = time.perf_counter() - started
    return level


async def run_all(base_url: str, api_key: str, args) -> list[Level]:
    headers = {"Authorization": f"Bearer {api_key}", **PROXY_HEADERS}
    limits = httpx.Limits(max_connections=max(args.concurrency) + 8)
    levels = []
    async with httpx.AsyncClient(
        headers=headers, timeout=REQUEST_TIMEOUT_S, limits=limits
    ) as client:
        for path in ("ingest", "gateway"):
            for concurrency in args.concurrency:
                level = await run_level(client, base_url, path, concurrency, args)
                levels.append(level)
                baseline = next(lv for lv in levels if lv.path == path).ok_rate()
                print(level.row(baseline), flush=True)
    return levels


def count_rows(database_url: str, project_id: int) -> tuple[set[str], int]:
    with psycopg.connect(database_url, autocommit=True) as connection:
        traces = {
            row[0]
            for row in connection.execute(
                "SELECT external_id FROM reviewapp_trace WHERE project_id = %s AND source = 'api'",
                (project_id,),
            )
        }
        calls = connection.execute(
            "SELECT count(*) FROM reviewapp_modelcall WHERE project_id = %s", (project_id,)
        ).fetchone()[0]
    return traces, calls


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", default="1,4,16,64", help="levels, comma-separated")
    parser.add_argument("--requests", type=int, default=200, help="requests per level and path")
    parser.add_argument("--batch", type=int, default=20, help="traces per ingest request")
    parser.add_argument("--ingest-limit", type=int, default=8, help="INGEST_MAX_IN_FLIGHT")
    parser.add_argument("--gateway-limit", type=int, default=32, help="GATEWAY_MAX_IN_FLIGHT")
    parser.add_argument("--max-seconds", type=float, default=600, help="the whole run at most")
    parser.add_argument(
        "--admin-url",
        default=os.environ.get(
            "BENCH_ADMIN_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"
        ),
        help="a database on a server where this user may CREATE DATABASE",
    )
    args = parser.parse_args(argv)
    args.concurrency = tuple(int(part) for part in args.concurrency.split(","))
    if args.requests < 1 or args.batch < 1 or min(args.concurrency) < 1:
        parser.error("--requests, --batch and every concurrency must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    database_url = args.admin_url.rsplit("/", 1)[0] + f"/{BENCH_DATABASE}"
    recreate_database(args.admin_url, BENCH_DATABASE)
    try:
        setup_django(database_url)
        with running_upstream(cores=None, lifetime=args.max_seconds) as upstream_url:
            project_id, api_key = create_project_with_key(
                slug="load", upstream_url=upstream_url, served_model=SERVED_MODEL
            )
            port = free_port()
            environment = {
                **server_environment(database_url),
                "INGEST_MAX_IN_FLIGHT": str(args.ingest_limit),
                "GATEWAY_MAX_IN_FLIGHT": str(args.gateway_limit),
                "LOG_LEVEL": "ERROR",  # not a line per refused request
            }
            base_url = f"http://127.0.0.1:{port}"

            def ready() -> bool:
                try:
                    url = f"{base_url}/api/v1/openapi.json"
                    return httpx.get(url, headers=PROXY_HEADERS, timeout=2).is_success
                except httpx.TransportError:
                    return False

            print(
                f"web: 1 uvicorn process, admission limits ingest {args.ingest_limit} / "
                f"gateway {args.gateway_limit} in flight; {args.requests} requests per level, "
                f"ingest batches of {args.batch} traces; client timeout {REQUEST_TIMEOUT_S:.0f} s"
            )
            with running_process(
                "web process", server_command(port, 1), env=environment, cores=None, ready=ready
            ):
                levels = asyncio.run(
                    asyncio.wait_for(run_all(base_url, api_key, args), args.max_seconds)
                )
                gateway_answered = sum(
                    lv.statuses.get(200, 0) for lv in levels if lv.path == "gateway"
                )
                deadline = time.monotonic() + RECORDING_TIMEOUT_S
                while True:
                    stored, calls = count_rows(database_url, project_id)
                    if calls >= gateway_answered or time.monotonic() > deadline:
                        break
                    time.sleep(0.2)
        acknowledged = set().union(*(lv.acknowledged for lv in levels))
        lost = acknowledged - stored
        print(
            f"stored traces {len(stored)}, acknowledged 201 {len(acknowledged)}, "
            f"acknowledged but missing {len(lost)}, stored but never acknowledged "
            f"{len(stored - acknowledged)}"
        )
        print(f"gateway calls answered 200: {gateway_answered}, recorded: {calls}")
        timeouts = sum(lv.timeouts for lv in levels)
        no_retry_after = sum(lv.refused_without_retry_after for lv in levels)
        print(f"timeouts {timeouts}; 503 without Retry-After {no_retry_after}")
        return 1 if lost or timeouts or no_retry_after or calls < gateway_answered else 0
    finally:
        drop_database(args.admin_url, BENCH_DATABASE)


if __name__ == "__main__":
    sys.exit(main())
