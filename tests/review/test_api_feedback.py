import pytest

from reviewapp import jobs
from reviewapp.review.models import Feedback
from reviewapp.traces.models import Trace
from tests.factories import make_trace

TRACES = "/api/v1/traces"
FEEDBACK = "/api/v1/traces/t-1/feedback"


@pytest.fixture
def stored(api, project):
    api.post(TRACES, {"traces": [make_trace("t-1")]})
    return Trace.objects.get(project=project, external_id="t-1")


def test_it_pins_feedback_to_an_assistant_turn(api, stored):
    response = api.post(FEEDBACK, {"text": "Say the result first.", "turn": 4, "author": "alice"})
    assert response.status_code == 201
    feedback = Feedback.objects.get(trace=stored)
    assert (feedback.turn, feedback.author, feedback.text) == (4, "alice", "Say the result first.")
    review = api.get(f"{TRACES}/t-1").json()["review"]
    assert review["reviewed"] is True
    assert review["feedback"][0]["turn"] == 4


def test_feedback_without_a_turn_is_about_the_whole_trace(api, stored):
    response = api.post(FEEDBACK, {"text": "Too slow overall.", "rating": -1})
    assert response.status_code == 201
    assert response.json()["turn"] is None
    assert response.json()["author"] == "api"


def test_feedback_pinned_to_a_tool_call_finds_its_turn(api, stored):
    response = api.post(FEEDBACK, {"text": "Use integers.", "tool_call_id": "call_1"})
    assert response.status_code == 201
    assert (response.json()["turn"], response.json()["tool_call_id"]) == (2, "call_1")


def test_the_same_feedback_sent_twice_is_stored_once(api, stored):
    payload = {"text": "Say the result first.", "turn": 4}
    assert api.post(FEEDBACK, payload).status_code == 201
    again = api.post(FEEDBACK, payload)
    assert again.status_code == 200
    assert Feedback.objects.filter(trace=stored).count() == 1


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        ({"text": "x", "turn": 1}, "turn: message 1 is a user message"),
        ({"text": "x", "turn": 99}, "turn: 99 is outside"),
        ({"text": "x", "turn": -1}, "turn:"),
        ({"text": ""}, "text:"),
        ({"turn": 4}, "text:"),
        ({"text": "x", "tool_call_id": "call_404"}, "tool_call_id: 'call_404' is not a tool call"),
        ({"text": "x", "tool_call_id": "call_1", "turn": 4}, "turn: 4 does not hold tool call"),
        ({"text": "x", "correction": {"content": "84"}}, "pin the feedback to a turn"),
        ({"text": "x", "turn": 4, "correction": {"role": "user", "content": "y"}}, "assistant"),
        (
            {"text": "x", "turn": 4, "checks": [{"kind": "regex", "value": "("}]},
            "checks[0].value: not a valid regular expression",
        ),
        (
            {"text": "x", "turn": 4, "checks": [{"kind": "max_words", "value": 0}]},
            "checks[0].value: max_words needs a positive whole number",
        ),
        (
            {"text": "x", "turn": 4, "checks": [{"kind": "calls_tool", "value": "search"}]},
            "'search' is not a tool of this trace (calculator)",
        ),
        (
            {"text": "x", "turn": 4, "checks": [{"kind": "vibes", "value": 1}]},
            "checks[0].kind: 'vibes' is not one of",
        ),
        ({"text": "a\x00b"}, "NUL"),
    ],
)
def test_feedback_that_does_not_fit_the_trace_is_422_naming_the_field(api, stored, payload, words):
    response = api.post(FEEDBACK, payload)
    assert response.status_code == 422
    assert words in response.json()["detail"]
    assert not Feedback.objects.exists()


def test_a_corrected_tool_call_is_validated_against_the_tool_schema(api, stored):
    bad_call = {
        "tool_calls": [
            {
                "id": "c",
                "type": "function",
                "function": {"name": "calculator", "arguments": '{"expr": "1+1"}'},
            }
        ]
    }
    response = api.post(FEEDBACK, {"text": "wrong arg name", "turn": 2, "correction": bad_call})
    assert response.status_code == 422
    assert "'expression' is a required property" in response.json()["detail"]
    bad_call["tool_calls"][0]["function"]["arguments"] = '{"expression": "1+1"}'
    response = api.post(FEEDBACK, {"text": "wrong arg name", "turn": 2, "correction": bad_call})
    assert response.status_code == 201
    assert response.json()["correction"]["role"] == "assistant"


def test_a_correction_with_text_and_checks_is_stored(api, stored):
    payload = {
        "text": "Lead with the number.",
        "turn": 4,
        "correction": {"role": "assistant", "content": "84."},
        "checks": [{"kind": "regex", "value": "^84"}, {"kind": "max_words", "value": 5}],
    }
    assert api.post(FEEDBACK, payload).status_code == 201
    feedback = Feedback.objects.get()
    assert feedback.correction == {"role": "assistant", "content": "84."}
    assert feedback.checks == payload["checks"]


def test_outcome_updates_only_the_fields_given(api, stored):
    response = api.post(f"{TRACES}/t-1/outcome", {"reward": 0.25})
    assert response.status_code == 200
    stored.refresh_from_db()
    assert (stored.reward, stored.success, stored.termination) == (0.25, True, "completed")
    api.post(f"{TRACES}/t-1/outcome", {"success": False, "termination": "timeout"})
    stored.refresh_from_db()
    assert (stored.reward, stored.success, stored.termination) == (0.25, False, "timeout")


@pytest.mark.parametrize(
    "payload", [{}, {"termination": "exploded"}, {"reward": "lots"}, {"success": "maybe"}]
)
def test_a_bad_outcome_is_422_and_changes_nothing(api, stored, payload):
    response = api.post(f"{TRACES}/t-1/outcome", payload)
    assert response.status_code == 422
    assert response.json()["error"]
    stored.refresh_from_db()
    assert (stored.reward, stored.success, stored.termination) == (1.0, True, "completed")


def test_openapi_document_lists_the_contract(client):
    paths = client.get("/api/v1/openapi.json").json()["paths"]
    assert {
        "/api/v1/traces",
        "/api/v1/traces/{external_id}",
        "/api/v1/traces/{external_id}/feedback",
        "/api/v1/traces/{external_id}/outcome",
    } <= set(paths)


def test_new_feedback_asks_a_worker_for_targets_once_committed(
    api, stored, django_capture_on_commit_callbacks, enqueued
):
    with django_capture_on_commit_callbacks(execute=True):
        api.post(FEEDBACK, {"text": "Say the result first.", "turn": 4})
        api.post(FEEDBACK, {"text": "Say the result first.", "turn": 4})  # a resend
    assert enqueued.of(jobs.PROPOSE_TARGETS) == [(Feedback.objects.get().pk,)]
