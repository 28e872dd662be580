"""Environment monitors on a big project: server time of the monitors and the alerts.

Run from the repository root, with PostgreSQL reachable:

    python bench/monitors.py --traces 100000

It loads the same synthetic traces as bench/dashboard.py (COPY, summary columns as ingest
computes them, small compressed bodies, reviewer feedback on 2%), ANALYZEs, then times
`compute_monitor` per day and per hour (with and without the body sample), the alerts, and the
monitors page through Django's test client. The baseline, measured in the same run, is the
cheapest grouped query that could back the page: trace counts per model version.
"""

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from scratch_db import (
    add_admin_url_argument,
    drop_database,
    recreate_database,
    scratch_database_url,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from dashboard import copy_reviews, copy_traces, setup_django, timed  # noqa: E402

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


def run(config: BenchConfig) -> None:
    setup_django(config.database_url)
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.db.models import Count
    from django.test import Client

    from reviewapp.models import Membership, Trace
    from reviewapp.services.alerts import project_alerts
    from reviewapp.services.monitors import compute_monitor
    from reviewapp.services.projects import create_project

    project = create_project(slug="bench", name="Bench")
    reviewer = get_user_model().objects.create_user("rita", password="bench-only")
    Membership.objects.create(project=project, user=reviewer, role="reviewer")
    seconds = copy_traces(project_id=project.pk, count=config.traces, seed=config.seed)
    tags, feedback = copy_reviews(project=project, reviewer=reviewer, seed=config.seed)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    print(f"loaded {config.traces} traces in {seconds:.1f}s ({tags} tags, {feedback} feedback)")

    traces = Trace.objects.filter(project=project)
    client = Client()
    client.force_login(reviewer)
    monitor = compute_monitor(traces=traces)
    print(
        f"{len(monitor.versions)} versions, {len(monitor.buckets)} day buckets, "
        f"{monitor.bodies_read} bodies sampled per monitor"
    )

    def page() -> None:
        response = client.get("/p/bench/monitors/", secure=True)
        assert response.status_code == 200, response.status_code

    cases = {
        "baseline: count per version": lambda: list(
            traces.order_by().values("model", "adapter_version").annotate(n=Count("id"))
        ),
        "monitor per day, SQL only": lambda: compute_monitor(traces=traces, read_bodies=False),
        "monitor per day": lambda: compute_monitor(traces=traces),
        "monitor per hour": lambda: compute_monitor(traces=traces, bucket="hour"),
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
    recreate_database(config.admin_url, BENCH_DATABASE)
    started = time.perf_counter()
    try:
        run(config)
    finally:
        from django.db import connections

        connections.close_all()
        drop_database(config.admin_url, BENCH_DATABASE)
    print(f"done in {time.perf_counter() - started:.0f}s")


if __name__ == "__main__":
    main()
