"""Fill a demo project so a fresh install has something to look at. Safe to run again."""

import random
import secrets
from datetime import UTC, datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from reviewapp.models import Project, TraceSource
from reviewapp.services.ingest import ingest_traces
from reviewapp.services.projects import create_api_key, create_project

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a topic up in the company handbook.",
        "parameters": {
            "type": "object",
            "properties": {"topic": {"type": "string"}},
            "required": ["topic"],
        },
    },
}
HANDBOOK = {
    "refunds": "Refunds are issued within 14 days of purchase.",
    "shipping": "Orders ship within 2 business days.",
    "support hours": "Support is open 9:00-17:00 CET on weekdays.",
}


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
        "tools": [CALCULATOR, LOOKUP],
        "metadata": {"demo": True, "synthetic": True},
        "termination": termination,
        "outcome": {"success": termination == "completed"},
        "started_at": started.isoformat(),
        "ended_at": (started + timedelta(seconds=rng.randint(2, 40))).isoformat(),
    }


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
            key_file.parent.mkdir(parents=True, exist_ok=True)
            key_file.write_text(create_api_key(project=project, name="demo")[1] + "\n")
        password_file = Path(settings.VAR_DIR) / "admin-password"
        users = get_user_model().objects
        if not users.filter(username="admin").exists():
            password = secrets.token_urlsafe(12)
            users.create_superuser("admin", "admin@example.invalid", password)
            password_file.write_text(password + "\n")
        rng = random.Random(7)
        results = ingest_traces(
            project=project,
            raw_items=[demo_trace(index, rng) for index in range(traces)],
            source=TraceSource.IMPORT,
        )
        created = sum(result.status == 201 for result in results)
        self.stdout.write(f"demo project ready: {created} new traces")
        self.stdout.write(f"  API key:        {key_file}")
        self.stdout.write(f"  admin password: {password_file} (user 'admin')")
