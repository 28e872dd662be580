import orjson

from reviewapp.learning.models import DistillationTarget, TargetState
from reviewapp.projects.models import Membership
from reviewapp.review.feedback import record_feedback
from reviewapp.traces.ingest import ingest_traces
from reviewapp.traces.models import TraceTag
from tests.factories import make_trace

URL = "/api/v1/export.jsonl"


def lines(response) -> list[dict]:
    assert response.status_code == 200
    assert response["Content-Type"] == "application/jsonl"
    body = b"".join(response.streaming_content)
    return [orjson.loads(line) for line in body.splitlines()]


def test_a_correction_exports_the_context_and_the_corrected_turn(admin_api, project):
    ingest_traces(project=project, raw_items=[make_trace("t-1"), make_trace("t-2")])
    trace = project.traces.get(external_id="t-1")
    record_feedback(
        trace=trace, text="Lead with the number.", turn=4,
        correction={"role": "assistant", "content": "84."},
    )  # fmt: skip
    [line] = lines(admin_api.get(URL))
    assert line["messages"][-1] == {"role": "assistant", "content": "84."}
    assert [message["content"] for message in line["messages"][:-1]] == [
        message["content"] for message in make_trace("t-1")["messages"][:4]
    ]
    assert line["tools"][0]["function"]["name"] == "calculator"


def test_assistant_turns_before_a_correction_have_weight_zero(admin_api, project):
    ingest_traces(project=project, raw_items=[make_trace("t-1")])
    record_feedback(
        trace=project.traces.get(), text="Lead with the number.", turn=4,
        correction={"role": "assistant", "content": "84."},
    )  # fmt: skip
    [line] = lines(admin_api.get(URL))
    weights = [(message["role"], message.get("weight")) for message in line["messages"]]
    assert weights == [
        ("system", None),
        ("user", None),
        ("assistant", 0),  # the tool call before the corrected turn
        ("tool", None),
        ("assistant", None),  # the correction: trained on (OpenAI's default weight, 1)
    ]


def test_assistant_turns_before_a_teacher_target_have_weight_zero(admin_api, project):
    ingest_traces(project=project, raw_items=[make_trace("t-1")])
    feedback, _ = record_feedback(trace=project.traces.get(), text="Lead with the number.", turn=4)
    messages = make_trace("t-1")["messages"]
    DistillationTarget.objects.create(
        feedback=feedback,
        turn=4,
        source="hint",
        student_context=messages[:4],
        original=messages[4],
        target={"role": "assistant", "content": "84: 12 * 7."},
        state=TargetState.APPROVED,
    )
    [line] = lines(admin_api.get(URL))
    assert line["messages"][2]["weight"] == 0
    assert line["messages"][-1] == {"role": "assistant", "content": "84: 12 * 7."}


def test_reviewed_successes_are_exported_when_asked(admin_api, project, django_user_model):
    ingest_traces(project=project, raw_items=[make_trace("good"), make_trace("unreviewed")])
    reviewer = django_user_model.objects.create_user("rita")
    Membership.objects.create(project=project, user=reviewer, role="reviewer")
    tag = project.tags.create(name="exemplary")
    TraceTag.objects.create(
        trace=project.traces.get(external_id="good"), tag=tag, reviewer=reviewer
    )
    assert lines(admin_api.get(URL)) == []
    [line] = lines(admin_api.get(URL, include="reviewed"))
    assert line["messages"] == make_trace("good")["messages"]


def test_export_is_scoped_to_the_keys_project(admin_api, other_admin_api, project):
    ingest_traces(project=project, raw_items=[make_trace("t-1")])
    trace = project.traces.get()
    record_feedback(trace=trace, text="x", turn=4, correction={"content": "84."})
    assert len(lines(admin_api.get(URL))) == 1
    assert lines(other_admin_api.get(URL)) == []


def test_an_unknown_include_is_422(admin_api):
    response = admin_api.get(URL, include="everything")
    assert response.status_code == 422
    assert "include" in response.json()["detail"]
