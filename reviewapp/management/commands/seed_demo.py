"""Fill a demo project so a fresh install has something to look at. Safe to run again."""

import os
import random
import secrets
from datetime import UTC, datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from reviewapp.harness.tools import HANDBOOK, TOOL_DEFINITIONS
from reviewapp.projects.models import Membership, Project, Role
from reviewapp.projects.services import create_api_key, create_project
from reviewapp.review.feedback import record_feedback
from reviewapp.review.models import Queue
from reviewapp.review.queues import build_queue
from reviewapp.traces.ingest import ingest_traces
from reviewapp.traces.models import Tag, TraceSource, TraceTag

# The demo agent's own tools and handbook (reviewapp/harness/tools.py), so a seeded episode
# reads like the live ones the harness records.
DEMO_TOOLS = [
    definition
    for definition in TOOL_DEFINITIONS
    if definition["function"]["name"] in ("calculator", "lookup")
]


# The demo's failure taxonomy: (name, parent, description). The first nine get keys 1-9.
TAXONOMY = [
    ("answer", None, "Something is wrong with the final answer."),
    ("wrong-answer", "answer", "The answer is incorrect."),
    ("too-verbose", "answer", "Longer than the question needs."),
    ("made-up-fact", "answer", "States something no tool or message supports."),
    ("tools", None, "Something is wrong with how tools are used."),
    ("wrong-tool", "tools", "Called a tool that does not fit the question."),
    ("bad-arguments", "tools", "Called the right tool with wrong arguments."),
    ("ignored-tool-error", "tools", "Went on as if a failed tool call had worked."),
    ("good-example", None, "A trace worth learning from as it is."),
]


def demo_trace(index: int, rng: random.Random) -> dict:
    """One synthetic tool-using episode (stand-in until the demo harness records real ones)."""
    started = datetime(2026, 11, 1, tzinfo=UTC) + timedelta(minutes=17 * index)
    system = {"role": "system", "content": "You are a support agent. Use tools when they help."}
    if index % 2:
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        user = {"role": "user", "content": f"What is {a} * {b}?"}
        call = {"name": "calculator", "arguments": f'{{"expression": "{a}*{b}"}}'}
        result, answer = str(a * b), f"{a} * {b} = {a * b}."
    else:
        topic = rng.choice(sorted(HANDBOOK))
        user = {"role": "user", "content": f"What is your policy on {topic}?"}
        call = {"name": "lookup", "arguments": f'{{"topic": "{topic}"}}'}
        result, answer = HANDBOOK[topic], HANDBOOK[topic]
    termination = "completed"
    if index % 7 == 3:
        result, answer, termination = "Error: tool timed out after 5s", None, "tool_error"
    messages = [
        system,
        user,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": f"call_{index}", "type": "function", "function": call}],
        },
        {"role": "tool", "tool_call_id": f"call_{index}", "content": result},
    ]
    if answer:
        messages.append({"role": "assistant", "content": answer})
    return {
        "external_id": f"demo-{index:04d}",
        "model": "SmolLM2-135M-Instruct",
        "messages": messages,
        "tools": DEMO_TOOLS,
        "metadata": {"demo": True, "synthetic": True},
        "termination": termination,
        "outcome": {"success": termination == "completed"},
        "started_at": started.isoformat(),
        "ended_at": (started + timedelta(seconds=rng.randint(2, 40))).isoformat(),
    }


def write_secret(path: Path, text: str) -> None:
    """Write `path` readable by this user only (0600), whatever the umask: it is a credential."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as file:
        os.fchmod(file.fileno(), 0o600)  # an existing file keeps its mode through os.open
        file.write(text)


class Command(BaseCommand):
    help = "Create the demo project, an admin login and an API key, and load demo traces."

    def add_arguments(self, parser):
        parser.add_argument("--traces", type=int, default=60)

    def handle(self, *args, traces: int, **options):
        project = Project.objects.filter(slug="demo").first() or create_project(
            slug="demo", name="Demo support agent"
        )
        key_file = Path(settings.VAR_DIR) / "demo-api-key"
        if not key_file.exists():
            write_secret(key_file, create_api_key(project=project, name="demo")[1] + "\n")
        password_file = Path(settings.VAR_DIR) / "admin-password"
        users = get_user_model().objects
        if not users.filter(username="admin").exists():
            password = secrets.token_urlsafe(12)
            users.create_superuser("admin", "admin@example.invalid", password)
            write_secret(password_file, password + "\n")
        for secret_file in (key_file, password_file):  # written 0644 by an earlier version
            if secret_file.exists():
                os.chmod(secret_file, 0o600)
        rng = random.Random(7)
        results = ingest_traces(
            project=project,
            raw_items=[demo_trace(index, rng) for index in range(traces)],
            source=TraceSource.IMPORT,
        )
        created = sum(result.status == 201 for result in results)
        admin = users.get(username="admin")
        Membership.objects.get_or_create(project=project, user=admin, defaults={"role": Role.ADMIN})
        self._review_some(project, admin)
        self.stdout.write(f"demo project ready: {created} new traces")
        self.stdout.write(f"  API key:        {key_file}")
        self.stdout.write(f"  admin password: {password_file} (user 'admin')")

    def _review_some(self, project: Project, admin) -> None:
        """A taxonomy, a few tagged traces with feedback, and a queue: every page has something."""
        tags: dict[str, Tag] = {}
        for name, parent, description in TAXONOMY:
            tags[name], _ = Tag.objects.get_or_create(
                project=project,
                name=name,
                defaults={"parent": tags.get(parent), "description": description},
            )
        traces = {trace.external_id: trace for trace in project.traces.filter(source="import")}
        if "demo-0003" not in traces or traces["demo-0003"].feedback.exists():
            return  # fewer demo traces asked for, or reviewed on an earlier run
        reviewed = [
            ("demo-0003", "ignored-tool-error", None),
            ("demo-0001", "good-example", None),
            ("demo-0002", "too-verbose", "Answer in one sentence; do not repeat the question."),
            ("demo-0005", "wrong-answer", "Give the product as a number only, e.g. 42."),
        ]
        for external_id, tag_name, text in reviewed:
            trace = traces[external_id]
            TraceTag.objects.get_or_create(trace=trace, tag=tags[tag_name], reviewer=admin)
            if text is None:
                continue
            messages = trace.body_json()["messages"]
            # The product question gets a corrected reply too: a target that needs no teacher.
            correction = (
                {"role": "assistant", "content": messages[3]["content"]}
                if tag_name == "wrong-answer"
                else None
            )
            record_feedback(
                trace=trace,
                text=text,
                turn=len(messages) - 1,
                reviewer=admin,
                author=admin.get_username(),
                correction=correction,
                checks=[{"kind": "max_words", "value": 12}],
            )
        record_feedback(
            trace=traces["demo-0003"],
            text="The lookup failed: say so and offer to try again, do not guess.",
            reviewer=admin,
            author=admin.get_username(),
        )
        if not Queue.objects.filter(project=project).exists():
            build_queue(
                project=project,
                name="Tool errors",
                filters={"termination": ["tool_error"]},
                filter_query="termination=tool_error",
                sample_size=None,
                seed=None,
                reviewers_per_item=1,
                blind=False,
                assignees=[],
                created_by=admin,
            )
