"""Dashboard server time on a big project: the trace list and a long trace's page.

Run from the repository root, with PostgreSQL reachable:

    python bench/dashboard.py --traces 1000000

It creates a scratch database, loads the traces with COPY (summary columns and the searched text
as ingest computes them, a small compressed body, some tags and feedback), ANALYZEs, then times
the pages through
Django's test client as a logged-in reviewer. The baseline, measured in the same run, is the
page's own database work: the list's queryset evaluated alone and its EXPLAIN ANALYZE, and for
the trace page loading and unpacking the body, so what the view and template add is visible.
"""

import argparse
import os
import random
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlencode

from psycopg import sql
from psycopg.types.json import Jsonb
from scratch_db import (
    add_admin_url_argument,
    scratch_database,
    scratch_database_url,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))  # `python bench/dashboard.py` puts bench/, not the root, first

BENCH_DATABASE = "apprentice_bench_dashboard"
SECRET_KEY = "bench-only-secret-key-not-for-production-0123456789-abcdefghijklmnop"
SLOW_QUERY_MS = 50.0  # a list query slower than this gets its plan printed


@dataclass(frozen=True)
class BenchConfig:
    traces: int  # rows loaded into reviewapp_trace
    requests: int  # timed requests per list case
    detail_requests: int  # timed requests of the long trace's page
    detail_messages: int  # messages in the long trace
    seed: int  # the same seed loads the same rows
    admin_url: str  # a database to CREATE/DROP the scratch database from

    def __post_init__(self):
        for name in ("traces", "requests", "detail_requests", "detail_messages"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1")

    @property
    def database_url(self) -> str:
        return scratch_database_url(self.admin_url, BENCH_DATABASE)


def parse_args() -> BenchConfig:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--detail-requests", type=int, default=20)
    parser.add_argument("--detail-messages", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=11)
    add_admin_url_argument(parser)
    return BenchConfig(**vars(parser.parse_args()))


# --- the scratch database ---------------------------------------------------------------------


def setup_django(database_url: str) -> None:
    """Point Django at the scratch database, configured as production runs it, and migrate."""
    os.environ["DATABASE_URL"] = database_url
    os.environ["DJANGO_SETTINGS_MODULE"] = "reviewapp.settings"
    os.environ["DJANGO_DEBUG"] = "false"  # DEBUG on would also keep every query in memory
    os.environ["DJANGO_SECRET_KEY"] = SECRET_KEY
    os.environ["DJANGO_ALLOWED_HOSTS"] = "testserver"  # the test client's host
    os.environ["LOG_LEVEL"] = "WARNING"
    # whitenoise looks for collectstatic's output, which the test client never asks for.
    warnings.filterwarnings("ignore", message="No directory at")
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    # Production's manifest storage needs collectstatic first; plain URLs cost the same to build.
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }

    call_command("migrate", verbosity=0)


# --- synthetic rows ---------------------------------------------------------------------------

TERMINATIONS = {
    "completed": 70, "max_steps": 7, "tool_error": 8, "timeout": 5, "error": 5,
    "client_disconnected": 2, "unknown": 3,
}  # fmt: skip
MODELS = ["SmolLM2-135M-Instruct", "SmolLM2-360M-Instruct", "qwen2.5-7b-instruct"]
ADAPTERS = ["", "", "", "acme-v1", "acme-v2", "acme-v3"]
REQUESTS = [
    "My order {n} arrived broken, can I get my money back?",
    "Where is my parcel? Order {n} was due on Monday.",
    "Fix the failing test in module {n} and explain the change.",
    "Summarise ticket {n} for the on-call engineer.",
    "The discount code did not apply to order {n}.",
    "Migrate table {n} to the new schema without downtime.",
]
RARE_WORD = "Oslo"  # in about 1 preview in 500: what a reviewer searching for something types
ABSENT_WORD = "zanzibar"  # in none: the search reads every row
ANSWERS = [
    "Order {n} was delivered yesterday; the courier left it with a neighbour.",
    "I have refunded order {n}. The money is back on your card within 3-5 business days.",
    "The failing test in module {n} expected the old column name; I renamed it and it passes.",
    "Ticket {n}: the nightly import stopped after the schema change, nothing was lost.",
    "The discount code expired before order {n} was placed, so I applied it by hand.",
    "I could not finish: the lookup for order {n} failed twice, please check the service.",
]
# What the order tool answers when it fails: the common errors, and a rare one only ever seen
# in a tool result (never in an answer or a first message), as a reviewer would paste it.
TOOL_ERRORS = [
    "Error: upstream timed out after 30 s",
    'Error: 404 {"error": "order not found"}',
    "Error: rate limited by the order service, retry after 2 s",
]
RARE_TOOL_ERROR = "ledger shard 7 unreachable"  # in about 1 trace's tool output in 1000
RARE_TOOL_ERROR_SHARE = 0.001
# Its words and the common errors' words are in many rows, the phrase in none: the trigram
# index finds candidates that each have to be read and rechecked.
ABSENT_TOOL_ERROR = "refund timed out"
TAG_NAMES = ["wrong-tool", "hallucination", "gave-up", "too-verbose", "unsafe", "loop"]
COMMON_TAG, RARE_TAG = "wrong-tool", "unsafe"
# Share of traces carrying each tag (put on by a reviewer); the rest carry none.
TAG_SHARE = {"wrong-tool": 0.02, "hallucination": 0.01, "gave-up": 0.01, "unsafe": 0.0005}
FEEDBACK_SHARE = 0.02
BODY_VARIANTS = 64  # distinct small bodies, reused: the list never reads them


def _small_bodies(rng: random.Random) -> list[bytes]:
    from reviewapp.traces.models import Trace

    bodies = []
    for variant in range(BODY_VARIANTS):
        call = {
            "id": f"call_{variant}",
            "type": "function",
            "function": {"name": "lookup_order", "arguments": '{"order_id": "A-1"}'},
        }
        messages = [
            {"role": "user", "content": rng.choice(REQUESTS).format(n=variant)},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": '{"status": "delivered"}'},
            {"role": "assistant", "content": "It was delivered yesterday."},
        ]
        bodies.append(Trace.pack_body(messages=messages, tools=[]))
    return bodies


def _searched_text(rng: random.Random, index: int, termination: str) -> str:
    """The trace's `search_text` as ingest extracts it from its messages: tool errors first,
    then the answers and tool calls (a successful tool result is not searched)."""
    from reviewapp.traces.ingest import search_text

    order = f"A-{index}"
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "lookup_order", "arguments": f'{{"order_id": "{order}"}}'},
    }
    if rng.random() < RARE_TOOL_ERROR_SHARE:
        result = f"Error: {RARE_TOOL_ERROR} (code LX-4471), the refund was not booked"
    elif termination == "tool_error":
        result = rng.choice(TOOL_ERRORS)
    else:
        result = '{"status": "delivered"}'
    return search_text(
        [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": result},
            {"role": "assistant", "content": rng.choice(ANSWERS).format(n=order)},
        ]
    )


def trace_rows(project_id: int, count: int, seed: int) -> Iterator[dict]:
    """Column values of `count` traces, oldest first, as ingest would have computed them.

    The bodies are a few shared variants (the list never reads them); the searched text is
    drawn per trace, from its own generator so the other columns are drawn as before.
    """
    rng = random.Random(seed)
    text_rng = random.Random(seed + 3)
    bodies = _small_bodies(rng)
    terminations = rng.choices(list(TERMINATIONS), weights=list(TERMINATIONS.values()), k=count)
    start = datetime(2025, 1, 1, tzinfo=UTC)
    metadata = [Jsonb({"customer": f"c-{n}", "harness": "bench"}) for n in range(500)]
    for index in range(count):
        received = start + timedelta(seconds=index * 3)
        messages = min(int(rng.paretovariate(1.2) * 4) + 2, 400)
        success = rng.random() < 0.7 if terminations[index] == "completed" else False
        preview = rng.choice(REQUESTS).format(n=f"A-{index}")
        if rng.random() < 0.002:
            preview += f" I am in {RARE_WORD} this week."
        yield {
            "project_id": project_id,
            "external_id": f"run-{index:08d}",
            "source": "api" if index % 10 else "gateway",
            "model": MODELS[index % 7 % 3],
            "adapter_version": ADAPTERS[index % 6],
            "termination": terminations[index],
            "reward": round(rng.random(), 3) if success else 0.0,
            "success": success,
            "metadata": metadata[index % 500],
            "started_at": received - timedelta(seconds=90),
            "ended_at": received - timedelta(seconds=1),
            "received_at": received,
            "prompt_tokens": 300 * messages,
            "completion_tokens": 40 * messages,
            "message_count": messages,
            "tool_call_count": messages // 3,
            "preview": preview,
            "search_text": _searched_text(text_rng, index, terminations[index]),
            "body": bodies[index % BODY_VARIANTS],
            "content_hash": f"{index:064x}",
        }


def copy_traces(*, project_id: int, count: int, seed: int) -> float:
    """COPY the synthetic traces into reviewapp_trace; seconds."""
    return copy_trace_rows(
        trace_rows(project_id, count, seed), columns=next(trace_rows(project_id, 1, seed))
    )


def copy_trace_rows(rows: Iterable[dict], *, columns: Iterable[str]) -> float:
    """COPY `rows`, drawn as they are written, into reviewapp_trace; seconds.

    Columns the generator does not know (not in `columns`: added later to the model) get the
    model's default.
    """
    from django.db import connection

    from reviewapp.traces.models import Trace

    fields = [field for field in Trace._meta.concrete_fields if not field.primary_key]
    known = set(columns)
    defaults = {
        field.column: field.get_db_prep_save(field.get_default(), connection)
        for field in fields
        if field.column not in known
    }
    copied = [field.column for field in fields]
    statement = sql.SQL("COPY reviewapp_trace ({}) FROM STDIN").format(
        sql.SQL(", ").join(sql.Identifier(column) for column in copied)
    )
    connection.ensure_connection()
    raw = connection.connection
    started = time.perf_counter()
    with raw.cursor() as cursor, cursor.copy(statement) as copy:
        for row in rows:
            row.update(defaults)
            copy.write_row([row[column] for column in copied])
    raw.commit()
    return time.perf_counter() - started


def copy_reviews(*, project, reviewer, seed: int) -> tuple[int, int]:
    """Tags and feedback by `reviewer` on a random share of the traces; (tags, feedback) rows."""
    from django.db import connection

    from reviewapp.traces.models import Tag

    rng = random.Random(seed + 1)
    trace_ids = list(project.traces.values_list("id", flat=True))
    tags = {name: Tag.objects.create(project=project, name=name) for name in TAG_NAMES}
    now = datetime.now(UTC)
    tag_rows = [
        (trace_id, tags[name].pk, reviewer.pk, now)
        for name, share in TAG_SHARE.items()
        for trace_id in rng.sample(trace_ids, int(len(trace_ids) * share))
    ]
    feedback_rows = [
        (trace_id, None, "", reviewer.pk, reviewer.username, "Look the order up first.",
         None, Jsonb([]), "open", now, f"{trace_id:064x}", True, "")
        for trace_id in rng.sample(trace_ids, int(len(trace_ids) * FEEDBACK_SHARE))
    ]  # fmt: skip
    raw = connection.connection
    with raw.cursor() as cursor:
        with cursor.copy(
            "COPY reviewapp_tracetag (trace_id, tag_id, reviewer_id, created_at) FROM STDIN"
        ) as copy:
            for row in tag_rows:
                copy.write_row(row)
        with cursor.copy(
            "COPY reviewapp_feedback (trace_id, turn, tool_call_id, reviewer_id, author, text,"
            " rating, checks, status, created_at, content_hash, from_reviewer, failure_reason)"
            " FROM STDIN"
        ) as copy:
            for row in feedback_rows:
                copy.write_row(row)
    raw.commit()
    return len(tag_rows), len(feedback_rows)


def long_trace(messages: int) -> dict:
    """An agent episode of `messages` messages: tool calls, their results, some thinking."""
    rng = random.Random(5)
    body = [
        {"role": "system", "content": "You are a coding agent. " * 40},
        {"role": "user", "content": "Make the test suite pass on the new schema."},
    ]
    call_number = 0
    while len(body) < messages - 1:
        call_number += 1
        call_id = f"call_{call_number}"
        arguments = f'{{"path": "src/module_{call_number % 50}.py", "start": {call_number}}}'
        body.append(
            {
                "role": "assistant",
                "content": "Next I will **read** the file and check `the schema`."
                if rng.random() < 0.5
                else None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": "read_file", "arguments": arguments},
                    }
                ],
            }
        )
        failed = rng.random() < 0.05
        result = "Error: file not found" if failed else "def handler(x):\n    return x\n" * 8
        body.append({"role": "tool", "tool_call_id": call_id, "content": result})
    body.append({"role": "assistant", "content": "All tests pass now."})
    return {
        "external_id": "long-trace",
        "messages": body[:messages],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "read_file",
                    "description": "Read a file.",
                    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
                },
            }
        ],
        "termination": "completed",
    }


# --- timing -----------------------------------------------------------------------------------


@dataclass
class Sample:
    seconds: float
    sql_seconds: float
    queries: int


def timed(action: Callable[[], object]) -> Sample:
    """Run `action`, timing it whole and its SQL round trips."""
    from django.db import connection

    spent = {"sql": 0.0, "queries": 0}

    def time_sql(execute, statement, params, many, context):
        started = time.perf_counter()
        try:
            return execute(statement, params, many, context)
        finally:
            spent["sql"] += time.perf_counter() - started
            spent["queries"] += 1

    with connection.execute_wrapper(time_sql):
        started = time.perf_counter()
        action()
        seconds = time.perf_counter() - started
    return Sample(seconds, spent["sql"], spent["queries"])


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(share * len(ordered)), len(ordered) - 1)]


def list_queryset(project, query: str):
    """The trace list's page query, built as views.traces.trace_list builds it."""
    from django.db.models import Count, Prefetch
    from django.http import QueryDict

    from reviewapp.traces.filters import TraceFilterForm, after_cursor, filtered_traces
    from reviewapp.traces.models import TraceTag
    from reviewapp.workbench.trace_list import PAGE_SIZE

    params = QueryDict(query)
    form = TraceFilterForm(params or None, project=project)
    filters = form.cleaned_data if form.is_valid() else {}
    traces = filtered_traces(project, filters)
    if params.get("cursor"):
        traces = after_cursor(traces, filters.get("sort") or "newest", params["cursor"])
    return (
        traces.defer("body", "metadata", "search_text")
        .annotate(feedback_count=Count("feedback"))
        .prefetch_related(Prefetch("trace_tags", TraceTag.objects.select_related("tag")))[
            : PAGE_SIZE + 1
        ]
    )


def explain(queryset) -> tuple[float, list[str]]:
    """EXPLAIN ANALYZE of the queryset's main query: (execution ms, plan lines)."""
    from django.db import connection

    statement, params = queryset.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + statement, params)
        plan = [line for (line,) in cursor.fetchall()]
    execution = next(line for line in plan if line.startswith("Execution Time"))
    return float(execution.split()[2]), plan


@dataclass
class ListCase:
    name: str
    query: str
    requests: list[Sample]
    queryset_alone: list[Sample]
    explain_ms: float
    plan: list[str]
    rows: int
    marked: int  # rows showing where the text search matched


def measure_list(*, client, project, name: str, query: str, repeats: int) -> ListCase:
    url = f"/p/{project.slug}/traces/" + (f"?{query}" if query else "")
    response = client.get(url, secure=True)  # warm: the first request pays for imports
    if response.status_code != 200:
        raise RuntimeError(f"{url} answered {response.status_code}")
    rows = response.content.count(b'<tr class="termination-')
    marked = response.content.count(b"<mark>")
    requests = [timed(lambda: client.get(url, secure=True)) for _ in range(repeats)]
    queryset_alone = [timed(lambda: list(list_queryset(project, query))) for _ in range(repeats)]
    explain_ms, plan = explain(list_queryset(project, query))
    return ListCase(name, query, requests, queryset_alone, explain_ms, plan, rows, marked)


# --- the run ----------------------------------------------------------------------------------


def run(config: BenchConfig) -> None:
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client

    from reviewapp.projects.models import Membership
    from reviewapp.projects.services import create_project
    from reviewapp.traces.ingest import ingest_traces
    from reviewapp.traces.models import Trace
    from reviewapp.traces.rendering import conversation

    project = create_project(slug="bench", name="Bench")
    reviewer = get_user_model().objects.create_user("alice", password="bench-password-1")
    Membership.objects.create(project=project, user=reviewer, role="reviewer")

    load_s = copy_traces(project_id=project.pk, count=config.traces, seed=config.seed)
    tag_count, feedback_count = copy_reviews(project=project, reviewer=reviewer, seed=config.seed)
    ingest_traces(project=project, raw_items=[long_trace(config.detail_messages)])
    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    analyze_s = time.perf_counter() - started
    print(
        f"loaded {config.traces:,} traces with COPY in {load_s:.1f} s "
        f"({config.traces / load_s:,.0f} rows/s, indexes in place), {tag_count:,} tags, "
        f"{feedback_count:,} feedback; ANALYZE {analyze_s:.1f} s"
    )

    client = Client()
    client.force_login(reviewer)
    ids = Trace.objects.filter(project=project).order_by("id").values_list("id", flat=True)
    deep_cursor = ids[config.traces // 10]  # 90% of the way down the newest-first list
    cases = [
        ("no filter", ""),
        ("termination=timeout", urlencode({"termination": "timeout"})),
        (f"text q={RARE_WORD.lower()} (1 in 500)", urlencode({"q": RARE_WORD.lower()})),
        (f"text q={ABSENT_WORD} (no match)", urlencode({"q": ABSENT_WORD})),
        ("tool error (1 in 1,000)", urlencode({"q": RARE_TOOL_ERROR})),
        ("tool error, absent phrase", urlencode({"q": ABSENT_TOOL_ERROR})),
        (f"tag={COMMON_TAG} (2%)", urlencode({"tag": COMMON_TAG})),
        (f"tag={RARE_TAG} (0.05%)", urlencode({"tag": RARE_TAG})),
        ("cursor 90% deep", urlencode({"cursor": deep_cursor})),
    ]
    results = [
        measure_list(
            client=client, project=project, name=name, query=query, repeats=config.requests
        )
        for name, query in cases
    ]
    report_list(results, config)

    long = Trace.objects.get(project=project, external_id="long-trace")
    url = f"/p/{project.slug}/traces/{long.pk}/"
    client.get(url, secure=True)
    page = [timed(lambda: client.get(url, secure=True)) for _ in range(config.detail_requests)]

    def load_and_unpack():
        return Trace.objects.get(pk=long.pk).body_json()["messages"]

    messages = load_and_unpack()
    unpack = [timed(load_and_unpack) for _ in range(config.detail_requests)]
    pairing = [timed(lambda: conversation(messages)) for _ in range(config.detail_requests)]
    html = client.get(url, secure=True).content
    report_detail(page, unpack, pairing, config, long.message_count, html)


def _ms(samples: list[Sample], share: float, attribute: str = "seconds") -> float:
    return percentile([getattr(sample, attribute) for sample in samples], share) * 1000


def report_list(results: list[ListCase], config: BenchConfig) -> None:
    print(
        f"\ntrace list, {config.traces:,} traces in the project, {config.requests} requests per "
        f"case; {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}"
    )
    print(
        f"  {'case':<30}{'rows':>5}{'marked':>7}{'page p50':>10}{'p95':>8}{'sql p50':>9}"
        f"{'queries':>8}{'qs alone':>10}{'EXPLAIN':>9}{'page/qs':>9}"
    )
    for case in results:
        page_p50 = _ms(case.requests, 0.5)
        alone_p50 = _ms(case.queryset_alone, 0.5)
        print(
            f"  {case.name:<30}{case.rows:>5}{case.marked:>7}{page_p50:>10.1f}"
            f"{_ms(case.requests, 0.95):>8.1f}{_ms(case.requests, 0.5, 'sql_seconds'):>9.1f}"
            f"{case.requests[0].queries:>8}"
            f"{alone_p50:>10.1f}{case.explain_ms:>9.1f}{page_p50 / alone_p50:>9.1f}"
        )
    print(
        "  (ms; marked: rows with a highlighted match; sql: time in SQL round trips during the"
        " request; qs alone: the page's queryset and its tag prefetch, evaluated without the"
        " view (a search's snippets take one more query in the view); EXPLAIN: its main"
        " query's execution time in PostgreSQL)"
    )
    print(
        f"  tool error: q={RARE_TOOL_ERROR!r}, only in tool results; absent phrase:"
        f" q={ABSENT_TOOL_ERROR!r}, its words in many rows, the phrase in none"
    )
    for case in results:
        if case.explain_ms >= SLOW_QUERY_MS:
            print(f"\nslow list query: {case.name} ({case.explain_ms:.0f} ms), its plan:")
            for line in case.plan:
                print(f"    {line}")


def report_detail(
    page: list[Sample],
    unpack: list[Sample],
    pairing: list[Sample],
    config: BenchConfig,
    messages: int,
    html: bytes,
) -> None:
    page_p50 = _ms(page, 0.5)
    baseline_p50 = _ms(unpack, 0.5) + _ms(pairing, 0.5)
    turns_shown = html.count(b'<article class="turn')
    print(f"\ntrace page, one trace of {messages:,} messages, {config.detail_requests} requests")
    print(
        f"  page:               p50 {page_p50:7.1f} ms, p95 {_ms(page, 0.95):7.1f} ms; "
        f"sql p50 {_ms(page, 0.5, 'sql_seconds'):.1f} ms in {page[0].queries} queries; "
        f"{len(html) / 1e6:.2f} MB of HTML, {turns_shown} turns shown, "
        f"{html.count(b'<option')} <option>s"
    )
    for label, samples in (
        ("load + unpack body", unpack),
        ("conversation()", pairing),
    ):
        print(f"  {label:<20}p50 {_ms(samples, 0.5):7.1f} ms, p95 {_ms(samples, 0.95):7.1f} ms")
    print(
        f"  page / (load + unpack + conversation): {page_p50 / baseline_p50:.1f}"
        " (conversation() renders every assistant turn's markdown, shown or not)"
    )


def main() -> None:
    config = parse_args()
    started = time.perf_counter()
    with scratch_database(config.admin_url, BENCH_DATABASE):
        setup_django(config.database_url)
        run(config)
    print(f"\nwhole run {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
