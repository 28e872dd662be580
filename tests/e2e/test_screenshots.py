"""The product as a reader sees it: a varied list and a reviewed trace render and can be captured,
on a wide screen and on a phone (390 px, in phone/).

The images in docs/screenshots are refreshed with
APPRENTICE_SCREENSHOTS=1 python -m pytest tests/e2e/test_screenshots.py
(otherwise they are written to a temporary folder and only checked).
"""

import json
import os
import random
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from reviewapp.review.feedback import record_feedback
from reviewapp.traces.ingest import ingest_traces
from reviewapp.traces.models import Tag, Trace, TraceTag
from reviewapp.traces.rollups import roll_up_traces
from tests.e2e.conftest import sign_in

SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"

pytestmark = pytest.mark.slow

TOOLS = {
    "lookup_order": ("Find an order by its number.", {"order_id": "string"}),
    "issue_refund": ("Refund part or all of an order.", {"order_id": "string", "amount": "number"}),
    "search_help_center": ("Search the help-center articles.", {"query": "string"}),
    "send_email": ("Email the customer.", {"to": "string", "subject": "string", "body": "string"}),
}
REQUESTS = [
    "My order A-{n} arrived broken, can I get my money back?",
    "Where is my parcel? Order A-{n} was due on Monday.",
    "How do I change the delivery address on A-{n}?",
    "I was charged twice for order A-{n}.",
    "Cancel my subscription please, and refund this month.",
    "Do you ship to Norway? Asking before I order.",
    "The discount code SPRING didn't apply to A-{n}.",
    "Can you resend the invoice for A-{n} to accounting@example.com?",
]
TERMINATIONS = ["completed"] * 6 + ["tool_error", "timeout", "max_steps", "client_disconnected"]
REFUND_ID = "support-refund-A-48213"
PHONE = {"width": 390, "height": 844}
TAG_NAMES = ["wrong-arguments", "hallucinated-policy", "gave-up", "too-verbose", "missed-refund"]


def _tool_definitions() -> list[dict]:
    return [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": description,
                "parameters": {
                    "type": "object",
                    "properties": {key: {"type": kind} for key, kind in arguments.items()},
                    "required": list(arguments)[:1],
                },
            },
        }
        for name, (description, arguments) in TOOLS.items()
    ]


def _call(call_id: str, name: str, **arguments) -> dict:
    function = {"name": name, "arguments": json.dumps(arguments)}
    return {"id": call_id, "type": "function", "function": function}


def list_trace(rng: random.Random, index: int) -> dict:
    """A short support episode: a request, a few lookups, an answer (or not, by termination)."""
    order = rng.randint(10000, 99999)
    termination = rng.choice(TERMINATIONS)
    messages = [
        {"role": "system", "content": "You are Acme's support agent. Use the tools; be brief."},
        {"role": "user", "content": rng.choice(REQUESTS).format(n=order)},
    ]
    for step in range(rng.randint(1, 4)):
        name, arguments = rng.choice(
            [
                ("lookup_order", {"order_id": f"A-{order}"}),
                ("issue_refund", {"order_id": f"A-{order}", "amount": rng.randint(5, 90)}),
                ("search_help_center", {"query": "refund policy damaged item"}),
            ]
        )
        call_id = f"call_{index}_{step}"
        call = _call(call_id, name, **arguments)
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        failed = termination == "tool_error" and step == 0
        result = "Error: upstream timed out after 30s" if failed else f'{{"order": "A-{order}"}}'
        messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
    if termination == "completed":
        messages.append({"role": "assistant", "content": "Done: I have sorted that out for you."})
    success = termination == "completed" and rng.random() < 0.8
    return {
        "external_id": f"support-{20250300 + index}",
        "model": rng.choice(["SmolLM2-135M-Instruct", "SmolLM2-360M-Instruct"]),
        "messages": messages,
        "tools": _tool_definitions(),
        "termination": termination,
        "outcome": {"success": success, "reward": round(rng.uniform(0.6, 1) if success else 0, 2)},
        "usage": {
            "prompt_tokens": rng.randint(800, 6000),
            "completion_tokens": rng.randint(40, 600),
        },
    }


def detail_trace() -> dict:
    """A refund handled with a wrong tool call, its error, a retry and a markdown answer."""
    return {
        "external_id": REFUND_ID,
        "model": "SmolLM2-135M-Instruct",
        "messages": [
            {
                "role": "system",
                "content": "You are Acme's support agent. Look orders up before acting on them. "
                "Refunds over 50 EUR need the customer's confirmation.",
            },
            {
                "role": "user",
                "content": "Hi, order A-48213 arrived with a cracked screen. "
                "I'd like a refund for the phone case only, not the charger.",
            },
            {
                "role": "assistant",
                "content": "Let me look that order up first.",
                "tool_calls": [_call("call_lookup", "lookup_order", order_id="A-48213")],
            },
            {
                "role": "tool",
                "tool_call_id": "call_lookup",
                "content": json.dumps(
                    {
                        "order_id": "A-48213",
                        "status": "delivered",
                        "items": [
                            {"sku": "CASE-9", "name": "Phone case", "price": 19.9},
                            {"sku": "CHG-65", "name": "65W charger", "price": 39.0},
                        ],
                        "total": 58.9,
                    },
                    indent=2,
                ),
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    _call("call_refund_1", "issue_refund", order_id="A-48213", amount=58.9)
                ],
            },
            {
                "role": "tool",
                "tool_call_id": "call_refund_1",
                "content": "Error: refunds over 50 EUR need customer_confirmed=true",
            },
            {
                "role": "assistant",
                "content": "That refund was too large; only the case should be refunded.",
                "tool_calls": [
                    _call("call_refund_2", "issue_refund", order_id="A-48213", amount=19.9)
                ],
            },
            {
                "role": "tool",
                "tool_call_id": "call_refund_2",
                "content": '{"refund_id": "R-7731", "amount": 19.9, "status": "issued"}',
            },
            {
                "role": "assistant",
                "content": "I've refunded the **phone case** on order A-48213:\n\n"
                "- Refund `R-7731`: 19.90 EUR, back on your card in 3-5 days\n"
                "- The charger stays as it is\n\n"
                "Sorry about the cracked screen. Anything else I can help with?",
            },
            {"role": "user", "content": "That's all, thanks!"},
        ],
        "tools": _tool_definitions(),
        "metadata": {"customer": "c-1042", "channel": "chat", "region": "eu-west"},
        "termination": "completed",
        "outcome": {"success": True, "reward": 0.7},
        "usage": {"prompt_tokens": 3120, "completion_tokens": 214},
        "started_at": "2025-03-14T09:12:03Z",
        "ended_at": "2025-03-14T09:12:41Z",
    }


def capture_on_a_phone(page, folder: Path, urls: dict[str, str]) -> list[Path]:
    """The same pages as a phone shows them, full length, in folder/phone/NAME.png."""
    page.set_viewport_size(PHONE)
    (folder / "phone").mkdir(exist_ok=True)
    paths = []
    for name, url in urls.items():
        page.goto(url)
        page.wait_for_load_state("networkidle")  # htmx fragments that load with the page
        paths.append(folder / "phone" / f"{name}.png")
        page.screenshot(path=paths[-1], full_page=True)
    return paths


@pytest.fixture
def demo_project(project, alice, bob):
    """About thirty varied traces, some tagged and with feedback, and one detailed refund."""
    rng = random.Random(4)
    ingest_traces(project=project, raw_items=[list_trace(rng, index) for index in range(30)])
    ingest_traces(project=project, raw_items=[detail_trace()])
    tags = [Tag.objects.create(project=project, name=name) for name in TAG_NAMES]
    now = timezone.now()
    for position, trace in enumerate(project.traces.order_by("-id")):
        Trace.objects.filter(pk=trace.pk).update(
            received_at=now - timedelta(minutes=37 * position),
            adapter_version="acme-support-v3" if position % 3 == 0 else "",
        )
        if trace.external_id == REFUND_ID:
            continue
        if trace.termination != "completed" or rng.random() < 0.2:
            for tag in rng.sample(tags, rng.randint(1, 2)):
                TraceTag.objects.create(trace=trace, tag=tag, reviewer=rng.choice([alice, bob]))
        if rng.random() < 0.25:
            record_feedback(trace=trace, text="Check the order before answering.", reviewer=bob)
    roll_up_traces(trace_ids=project.traces.values_list("id", flat=True))  # as writers do
    refund = project.traces.get(external_id=REFUND_ID)
    TraceTag.objects.create(trace=refund, tag=tags[0], reviewer=alice)
    record_feedback(
        trace=refund,
        tool_call_id="call_refund_1",
        text="The customer asked for the case only: refund 19.90, not the order total.",
        author="alice",
        reviewer=alice,
        rating=-1.0,
    )
    record_feedback(
        trace=refund,
        turn=8,
        text="Good recovery and a clear summary.",
        author="bob",
        reviewer=bob,
        rating=1.0,
    )
    return refund


def test_screenshots_of_the_trace_list_and_a_trace(
    context, page, live_server, alice, demo_project, tmp_path
):
    sign_in(context, alice, live_server)
    folder = SCREENSHOTS if os.environ.get("APPRENTICE_SCREENSHOTS") == "1" else tmp_path
    folder.mkdir(parents=True, exist_ok=True)

    page.goto("/p/acme/traces/")
    expect(page.locator("#trace-rows tr")).to_have_count(31)
    page.screenshot(path=folder / "trace-list.png", full_page=True)

    page.goto(f"/p/acme/traces/{demo_project.pk}/")
    expect(page.locator("#feedback-panel article.feedback")).to_have_count(2)
    page.screenshot(path=folder / "trace-detail.png", full_page=True)
    # The pages around them: the taxonomy (with an admin's edit controls), the training data,
    # and the queues.
    pages = {"tags": "/p/acme/tags/", "dataset": "/p/acme/dataset/", "queues": "/p/acme/queues/"}
    for name, url in pages.items():
        page.goto(url)
        page.screenshot(path=folder / f"{name}.png", full_page=True)
    names = ["trace-list.png", "trace-detail.png"] + [f"{name}.png" for name in pages]
    assert min((folder / name).stat().st_size for name in names) > 20_000

    list_and_trace = {
        "trace-list": "/p/acme/traces/",
        "trace-detail": f"/p/acme/traces/{demo_project.pk}/",
    }
    phone = capture_on_a_phone(page, folder, {**list_and_trace, **pages})
    assert min(path.stat().st_size for path in phone) > 20_000


@pytest.fixture
def seed_scenarios(project, api_key):
    """v1 meets healthy tools; v2 meets a 20% tool failure rate and answers tersely; v3 meets
    slow tools under a time budget. Each version's traces are spread over the days it served.
    Played before the browser starts: the harness's outcome reports go through the test client.
    """
    from tests.site.scenarios import SHORT_ANSWER, play

    play(project=project, api_key=api_key, adapter_version="acme-v1", seed=1)
    play(
        project=project, api_key=api_key, adapter_version="acme-v2", answer=SHORT_ANSWER,
        tool_failure_rate=0.2, seed=2,
    )  # fmt: skip
    play(
        project=project, api_key=api_key, adapter_version="acme-v3", answer=SHORT_ANSWER,
        tool_failure_rate=0.2, tool_latency=1.0, slow_tool_rate=0.3, time_budget=0.05, seed=3,
    )  # fmt: skip
    start = timezone.now() - timedelta(days=9)
    for number, version in enumerate(["acme-v1", "acme-v2", "acme-v3"]):
        ids = project.traces.filter(adapter_version=version).order_by("id").values_list("id")
        for index, (trace_id,) in enumerate(ids):
            moment = start + timedelta(days=3 * number + index % 3, minutes=index)
            Trace.objects.filter(pk=trace_id).update(received_at=moment)
    roll_up_traces(trace_ids=project.traces.values_list("id", flat=True))  # as writers do
    return project


def test_screenshot_of_the_monitors_on_the_seed_scenarios(
    seed_scenarios, context, page, live_server, alice, tmp_path
):
    sign_in(context, alice, live_server)
    folder = SCREENSHOTS if os.environ.get("APPRENTICE_SCREENSHOTS") == "1" else tmp_path
    folder.mkdir(parents=True, exist_ok=True)

    page.goto("/p/acme/monitors/")
    expect(page.locator("#alerts article.alert-item").first).to_be_visible()
    # The nav's alert count arrives over htmx, under the page's CSP.
    expect(page.locator(".project-nav .badge.alert")).to_be_visible()
    page.screenshot(path=folder / "monitors.png", full_page=True)
    assert (folder / "monitors.png").stat().st_size > 20_000
    (phone,) = capture_on_a_phone(page, folder, {"monitors": "/p/acme/monitors/"})
    assert phone.stat().st_size > 20_000
