"""More like this on the trace page, in Chromium: the fragment loads, a suggested tag goes on in
one click, and a feedback reaches only the similar trace the reviewer ticked."""

import numpy as np
import pytest
from playwright.sync_api import expect

from reviewapp.monitors import embeddings as similarity
from reviewapp.monitors.models import TraceEmbedding
from reviewapp.review.feedback import record_feedback
from reviewapp.review.models import Feedback
from reviewapp.traces.ingest import ingest_traces
from reviewapp.traces.models import Tag, TraceTag
from tests.factories import make_trace

pytestmark = pytest.mark.slow


@pytest.fixture
def embedded(project, alice):
    """t-0 is open; t-1 (tagged slow by alice) is nearest to it, t-2 next, t-3 far."""
    ingest_traces(project=project, raw_items=[make_trace(f"t-{i}") for i in range(4)])
    stored = {trace.external_id: trace for trace in project.traces.all()}
    directions = {"t-0": [1, 0], "t-1": [0.9, 0.1], "t-2": [0.8, 0.3], "t-3": [0, 1]}
    for external_id, values in directions.items():
        vector = np.zeros(similarity.DIMENSIONS, dtype=np.float32)
        vector[:2] = values
        TraceEmbedding.objects.create(
            project=project,
            trace=stored[external_id],
            model_name=similarity.MODEL_NAME,
            vector=similarity.to_bytes(vector / np.linalg.norm(vector)),
            content_hash="by hand",
        )
    slow = Tag.objects.create(project=project, name="slow")
    TraceTag.objects.create(trace=stored["t-1"], tag=slow, reviewer=alice)
    return stored


@pytest.fixture
def traces(embedded):
    """The same traces, t-0 with a feedback to copy."""
    record_feedback(trace=embedded["t-0"], text="Retry the tool once before giving up.")
    return embedded


def test_more_like_this_suggests_a_tag_and_applies_feedback_to_ticked_traces(bob_page, traces):
    page = bob_page
    errors = []
    page.on("console", lambda message: message.type == "error" and errors.append(message.text))
    page.goto(f"/p/acme/traces/{traces['t-0'].pk}/")

    similar = page.locator("#similar-traces .similar li a")
    expect(similar).to_have_text(["t-1", "t-2", "t-3"])
    page.get_by_role("button", name="+ slow").click()
    expect(page.locator("#review-tags .tag-toggle.on")).to_contain_text("slow")

    page.get_by_label("apply feedback to t-1").check()
    page.get_by_role("button", name="Apply to the ticked traces").click()

    expect(page.locator("#similar-traces")).to_contain_text("Feedback copied to 1 trace.")
    copied = Feedback.objects.filter(trace=traces["t-1"])
    assert [(feedback.text, feedback.author) for feedback in copied] == [
        ("Retry the tool once before giving up.", "bob")
    ]
    assert not Feedback.objects.filter(trace__in=[traces["t-2"], traces["t-3"]]).exists()
    assert errors == []  # nothing broke the content security policy


def test_feedback_written_on_the_page_can_be_applied_to_similar_traces_without_a_reload(
    bob_page, embedded
):
    page = bob_page
    page.goto(f"/p/acme/traces/{embedded['t-0'].pk}/")
    expect(page.locator("#similar-traces .similar li a")).to_have_count(3)
    expect(page.get_by_label("apply feedback to t-1")).to_have_count(0)

    page.locator("#feedback-form textarea[name=text]").fill("Check the tool's answer first.")
    page.get_by_role("button", name="Save feedback").click()

    page.get_by_label("apply feedback to t-2").check()
    page.get_by_role("button", name="Apply to the ticked traces").click()
    expect(page.locator("#similar-traces")).to_contain_text("Feedback copied to 1 trace.")
    assert [f.text for f in Feedback.objects.filter(trace=embedded["t-2"])] == [
        "Check the tool's answer first."
    ]
