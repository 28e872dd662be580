"""Environment monitors on a big project: server time of the monitors and the alerts.

Run from the repository root, with PostgreSQL reachable:

    python bench/monitors.py --traces 100000

It loads the same synthetic traces as bench/dashboard.py (COPY, summary columns as ingest
computes them, small compressed bodies, reviewer feedback on 2%) with per-trace facts (tool
results and errors per tool, answers and their words) drawn here and tallied as they are drawn,
then fills the rollups the monitors read (COPY bypasses the writers that keep them, so this is
the backfill migration 0021 runs, timed), ANALYZEs, checks that the monitor's per-tool figures
equal the tallies exactly and that every figure equals the sum over every trace, then times
`compute_monitor` per day and per hour (with and without the per-tool figures), the same sum
over every trace (what the page read before the rollups), the alerts, and the monitors page
through Django's test client. The baseline, measured in the same run, is the cheapest grouped
query over the traces that could back the page: trace counts per model version.
"""

import argparse
import random
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from psycopg.types.json import Jsonb
from scratch_db import (
    add_admin_url_argument,
    scratch_database,
    scratch_database_url,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from dashboard import (  # noqa: E402
    copy_reviews,
    copy_trace_rows,
    setup_django,
    timed,
    trace_rows,
)

BENCH_DATABASE = "apprentice_bench_monitors"


@dataclass(frozen=True)
class BenchConfig:
    traces: int
    repeats: int
    seed: int
    admin_url: str

    def __post_init__(self):
        if self.traces < 1 or self.repeats < 1:
            raise ValueError("--traces and --repeats must be at least 1")

    @property
    def database_url(self) -> str:
        return scratch_database_url(self.admin_url, BENCH_DATABASE)


def parse_args() -> BenchConfig:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=11)
    add_admin_url_argument(parser)
    return BenchConfig(**vars(parser.parse_args()))


# Tools the synthetic agents call, and how often each fails per adapter (base: the first rate).
TOOL_FAILURE = {
    "lookup_order": {"": 0.02, "acme-v1": 0.02, "acme-v2": 0.15, "acme-v3": 0.02},
    "refund": {"": 0.05, "acme-v1": 0.05, "acme-v2": 0.05, "acme-v3": 0.30},
    "search_docs": {"": 0.01, "acme-v1": 0.01, "acme-v2": 0.01, "acme-v3": 0.01},
    "send_email": {"": 0.10, "acme-v1": 0.10, "acme-v2": 0.10, "acme-v3": 0.10},
}


@dataclass
class Tally:
    """What was drawn, per (model, adapter_version, tool): the figures the monitor must show."""

    results: Counter
    errors: Counter


def with_facts(rows, seed: int, tally: Tally):
    """The dashboard's rows plus facts drawn per trace, counted into `tally` as drawn."""
    rng = random.Random(seed + 2)
    tools = list(TOOL_FAILURE)
    for row in rows:
        version = (row["model"], row["adapter_version"])
        results: dict[str, int] = {}
        errors: dict[str, int] = {}
        for _ in range(row["tool_call_count"]):
            name = tools[int(rng.random() * 4)]
            results[name] = results.get(name, 0) + 1
            if rng.random() < TOOL_FAILURE[name][row["adapter_version"]]:
                errors[name] = errors.get(name, 0) + 1
        for name, count in results.items():
            tally.results[(*version, name)] += count
        for name, count in errors.items():
            tally.errors[(*version, name)] += count
        answers = 1 + int(rng.random() * 3)
        yield {
            **row,
            "tool_results": Jsonb(results),
            "tool_errors": Jsonb(errors),
            "tool_result_count": sum(results.values()),
            "tool_error_count": sum(errors.values()),
            "answer_count": answers,
            "answer_words": answers * (5 + int(rng.random() * 40)),
            "truncated_replies": int(row["termination"] == "truncated"),
            # An answer straight after each failure, at most one per answer.
            "answers_after_tool_error": min(answers, sum(errors.values())),
        }


def copy_traces_with_facts(*, project_id: int, count: int, seed: int, tally: Tally) -> float:
    """COPY the synthetic traces with their facts into reviewapp_trace; seconds."""
    uncounted = Tally(Counter(), Counter())  # the row drawn for its columns is not tallied
    return copy_trace_rows(
        with_facts(trace_rows(project_id, count, seed), seed, tally),
        columns=next(with_facts(trace_rows(project_id, 1, seed), seed, uncounted)),
    )


def check_exact(monitor, tally: Tally) -> int:
    """Every (version, tool) figure of the monitor equals the tally; returns how many."""
    shown_results, shown_errors = Counter(), Counter()
    for group in monitor.versions:
        for name, tool in group.tools.items():
            key = (group.version.model, group.version.adapter_version, name)
            shown_results[key] += tool.calls
            shown_errors[key] += tool.errors
    if shown_results != tally.results or +shown_errors != +tally.errors:
        raise RuntimeError("the monitor's per-tool figures differ from what was drawn")
    return len(tally.results)


def figures(monitor) -> list:
    """Every group of a monitor as plain values, reward totals rounded to 9 places."""
    return [
        {**vars(group), "tools": dict(group.tools), "reward_total": round(group.reward_total, 9)}
        for group in [*monitor.versions, *monitor.series]
    ]


def statements_of(action) -> list[tuple[float, str]]:
    """(seconds, SQL) of each statement `action` runs."""
    from django.db import connection

    statements = []

    def time_statement(execute, statement, params, many, context):
        started = time.perf_counter()
        try:
            return execute(statement, params, many, context)
        finally:
            statements.append((time.perf_counter() - started, str(statement)))

    with connection.execute_wrapper(time_statement):
        action()
    return statements


def run(config: BenchConfig) -> None:
    setup_django(config.database_url)
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.db.models import Count
    from django.test import Client

    from reviewapp.monitors.alerts import project_alerts
    from reviewapp.monitors.monitors import compute_monitor, monitor_of_traces
    from reviewapp.projects.models import Membership
    from reviewapp.projects.services import create_project
    from reviewapp.traces.models import ToolRollup, Trace, TraceRollup
    from reviewapp.traces.rollups import rebuild_rollups

    project = create_project(slug="bench", name="Bench")
    reviewer = get_user_model().objects.create_user("rita", password="bench-only")
    Membership.objects.create(project=project, user=reviewer, role="reviewer")
    tally = Tally(Counter(), Counter())
    seconds = copy_traces_with_facts(
        project_id=project.pk, count=config.traces, seed=config.seed, tally=tally
    )
    tags, feedback = copy_reviews(project=project, reviewer=reviewer, seed=config.seed)
    print(f"loaded {config.traces} traces in {seconds:.1f}s ({tags} tags, {feedback} feedback)")
    started = time.perf_counter()
    rebuild_rollups(project_ids=[project.pk])
    print(
        f"rollups backfilled in {time.perf_counter() - started:.1f}s: "
        f"{TraceRollup.objects.filter(project=project).count():,} rows, "
        f"{ToolRollup.objects.filter(project=project).count():,} per-tool rows"
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")

    traces = Trace.objects.filter(project=project)
    client = Client()
    client.force_login(reviewer)
    monitor = compute_monitor(project=project)
    exact = check_exact(monitor, tally)
    print(
        f"{len(monitor.versions)} versions, {len(monitor.buckets)} day buckets; per-tool figures "
        f"exact: {exact} (version, tool) pairs, {sum(tally.results.values()):,} tool results and "
        f"{sum(tally.errors.values()):,} errors, equal to the drawn tallies"
    )
    for bucket in ("day", "hour"):
        over_traces = monitor_of_traces(traces=traces, bucket=bucket)
        from_rollups = figures(compute_monitor(project=project, bucket=bucket))
        if from_rollups != figures(over_traces):
            raise RuntimeError(f"the rollups' monitor per {bucket} differs from the traces'")
    print(
        "every figure of the monitor per day and per hour equals the sum over every trace "
        "(reward totals to 9 places: float sums in another order differ in the last bits)"
    )
    worst = max(
        ((group.version.label, name, tool) for group in monitor.versions
         for name, tool in group.tools.items()),
        key=lambda item: item[2].error_rate or 0,
    )  # fmt: skip
    print(
        f"highest failure rate: {worst[1]} in {worst[0]}, {worst[2].errors:,} of "
        f"{worst[2].calls:,} ({100 * worst[2].error_rate:.1f}%), "
        f"newest failing traces {worst[2].error_examples}"
    )

    print("statements of one monitor per day:")
    for seconds, statement in statements_of(lambda: compute_monitor(project=project)):
        print(f"  {1000 * seconds:8.1f} ms  {' '.join(statement.split())[:90]}")

    def page() -> None:
        response = client.get("/p/bench/monitors/", secure=True)
        assert response.status_code == 200, response.status_code

    cases = {
        "baseline: count per version": lambda: list(
            traces.order_by().values("model", "adapter_version").annotate(n=Count("id"))
        ),
        "sum over every trace, per day": lambda: monitor_of_traces(traces=traces),
        "monitor per day, no per-tool": lambda: compute_monitor(project=project, per_tool=False),
        "monitor per day": lambda: compute_monitor(project=project),
        "monitor per hour": lambda: compute_monitor(project=project, bucket="hour"),
        "alerts": lambda: project_alerts(project=project),
        "monitors page (GET)": page,
    }
    print(f"{'case':32} {'median ms':>10} {'max ms':>8} {'SQL ms':>8} {'queries':>8} {'x base':>7}")
    baseline = None
    for name, action in cases.items():
        action()  # warm
        samples = [timed(action) for _ in range(config.repeats)]
        median = statistics.median(sample.seconds for sample in samples)
        sql_median = statistics.median(sample.sql_seconds for sample in samples)
        baseline = baseline or median
        print(
            f"{name:32} {1000 * median:10.1f} {1000 * max(s.seconds for s in samples):8.1f} "
            f"{1000 * sql_median:8.1f} {samples[0].queries:8d} {median / baseline:7.1f}"
        )


def main() -> None:
    config = parse_args()
    started = time.perf_counter()
    with scratch_database(config.admin_url, BENCH_DATABASE):
        run(config)
    print(f"done in {time.perf_counter() - started:.0f}s")


if __name__ == "__main__":
    main()
