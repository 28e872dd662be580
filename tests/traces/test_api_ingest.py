import copy

import pytest

from reviewapp.traces.models import Tag, Trace, TraceTag
from tests.factories import ApiClient, make_trace

URL = "/api/v1/traces"


def statuses(response) -> list[int]:
    return [result["status"] for result in response.json()["results"]]


def test_it_stores_a_batch_and_answers_207_per_item(api, project):
    response = api.post(URL, {"traces": [make_trace("a"), make_trace("b")]})
    assert response.status_code == 207
    assert response.json()["results"] == [
        {"external_id": "a", "status": 201},
        {"external_id": "b", "status": 201},
    ]
    assert Trace.objects.filter(project=project).count() == 2


def test_replaying_the_same_batch_three_times_stores_each_trace_once(api, project):
    batch = {"traces": [make_trace(f"t-{i}") for i in range(5)]}
    first = api.post(URL, batch)
    second = api.post(URL, batch)
    third = api.post(URL, batch)
    assert statuses(first) == [201] * 5
    assert statuses(second) == statuses(third) == [200] * 5
    assert Trace.objects.filter(project=project).count() == 5


def test_the_same_id_twice_in_one_batch_is_stored_once(api, project):
    response = api.post(URL, {"traces": [make_trace("x"), make_trace("x")]})
    assert statuses(response) == [201, 200]
    assert Trace.objects.filter(project=project, external_id="x").count() == 1


def test_a_replay_with_different_content_is_a_conflict_and_keeps_the_stored_trace(api, project):
    api.post(URL, {"traces": [make_trace("x")]})
    changed = make_trace("x", messages=[{"role": "user", "content": "something else"}])
    response = api.post(URL, {"traces": [changed]})
    assert statuses(response) == [409]
    assert "different content" in response.json()["results"][0]["error"]
    stored = Trace.objects.get(project=project, external_id="x")
    assert stored.body_json()["messages"] == make_trace("x")["messages"]


def test_good_items_land_beside_bad_ones(api, project):
    bad = make_trace("bad")
    bad["messages"][1]["role"] = "robot"
    response = api.post(URL, {"traces": [make_trace("good-1"), bad, make_trace("good-2")]})
    assert statuses(response) == [201, 422, 201]
    error = response.json()["results"][1]["error"]
    assert error.startswith("messages[1].role:")
    assert "robot" in error
    assert set(Trace.objects.values_list("external_id", flat=True)) == {"good-1", "good-2"}


def test_get_returns_the_trace_exactly_as_sent(api, project):
    Tag.objects.create(project=project, name="wrong-tool")  # the harness's key only applies tags
    sent = make_trace("round-trip", started_at="2026-11-30T10:00:00Z", tags=["wrong-tool"])
    api.post(URL, {"traces": [sent]})
    got = api.get(f"{URL}/round-trip").json()
    assert got["messages"] == sent["messages"]
    assert got["tools"] == sent["tools"]
    assert got["metadata"] == sent["metadata"]
    assert got["termination"] == "completed"
    assert got["outcome"] == {"reward": 1.0, "success": True}
    assert got["started_at"].startswith("2026-11-30T10:00:00")
    assert got["tags"] == ["wrong-tool"]
    assert got["review"] == {"tags": ["wrong-tool"], "feedback": [], "reviewed": True}


def test_tags_on_ingest_join_the_taxonomy_once(review_api, project):
    review_api.post(
        URL, {"traces": [make_trace("a", tags=["slow", "loop"]), make_trace("b", tags=["slow"])]}
    )
    assert sorted(Tag.objects.filter(project=project).values_list("name", flat=True)) == [
        "loop",
        "slow",
    ]
    assert TraceTag.objects.filter(trace__project=project).count() == 3


def test_summary_columns_are_filled_at_ingest(api, project):
    api.post(URL, {"traces": [make_trace("a")]})
    trace = Trace.objects.get(project=project)
    assert (trace.message_count, trace.tool_call_count) == (5, 1)
    assert trace.preview == "What is 12 * 7?"
    assert trace.source == "api"


def invalid(mutate) -> dict:
    trace = make_trace("bad")
    mutate(trace)
    return trace


@pytest.mark.parametrize(
    ("mutate", "field", "words"),
    [
        (lambda t: t["messages"][1].update(role="robot"), "messages[1].role", "robot"),
        (
            lambda t: t["messages"][3].update(tool_call_id="call_9"),
            "messages[3].tool_call_id",
            "matches no tool call",
        ),
        (
            lambda t: t["messages"][2]["tool_calls"][0]["function"].update(arguments="{oops"),
            "messages[2].tool_calls[0].function.arguments",
            "JSON-encoded string",
        ),
        (
            lambda t: t["messages"][2]["tool_calls"][0]["function"].update(
                arguments={"expression": "1"}
            ),
            "messages[2].tool_calls[0].function.arguments",
            "valid string",
        ),
        (lambda t: t.update(messages=[]), "messages", "at least 1"),
        (lambda t: t.update(termination="exploded"), "termination", "completed"),
        (lambda t: t.pop("external_id"), "external_id", "required"),
        (lambda t: t.update(external_id="a/b"), "external_id", "'/'"),
        (lambda t: t["messages"][1].update(content="a\x00b"), "messages[1].content", "NUL"),
        (lambda t: t.update(metadata={"k": "\x00"}), "metadata.k", "NUL"),
        (lambda t: t["messages"][3].pop("tool_call_id"), "messages[3]", "tool_call_id"),
        (lambda t: t.update(outcome={"reward": "high"}), "outcome.reward", "number"),
        (
            lambda t: t.update(started_at="2026-01-02T00:00:00Z", ended_at="2026-01-01T00:00:00Z"),
            "",
            "ended_at is before started_at",
        ),
    ],
)
def test_invalid_items_are_rejected_naming_the_field(api, project, mutate, field, words):
    response = api.post(URL, {"traces": [invalid(mutate)]})
    assert response.status_code == 207
    [result] = response.json()["results"]
    assert result["status"] == 422
    assert result["error"].startswith(field)
    assert words in result["error"]
    assert not Trace.objects.exists()


def test_nesting_deeper_than_the_limit_is_rejected(api, settings):
    settings.INGEST_MAX_NESTING_DEPTH = 8
    deep: dict = {}
    node = deep
    for _ in range(20):
        node["d"] = {}
        node = node["d"]
    response = api.post(URL, {"traces": [make_trace("deep", metadata=deep)]})
    [result] = response.json()["results"]
    assert result["status"] == 422
    assert "nested deeper than 8" in result["error"]


def test_unknown_fields_are_ignored_with_a_warning(api):
    response = api.post(URL, {"traces": [make_trace("a", extenral_id="typo")]})
    [result] = response.json()["results"]
    assert result["status"] == 201
    assert result["warnings"] == ["unknown field 'extenral_id' ignored"]


def test_an_item_that_is_not_an_object_is_rejected_alone(api):
    response = api.post(URL, {"traces": ["nope", make_trace("ok")]})
    assert statuses(response) == [422, 201]


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b'{"traces": [{"external_id": "n", "metadata": {"x": NaN}}]}', "NaN and Infinity"),
        (b'{"traces": [{"external_id": "n", "metadata": {"x": -Infinity}}]}', "NaN and Infinity"),
        (b'{"traces": [{"external_id": "\\ud800"}]}', "surrogate"),
        (b'{"traces": [' + b"[" * 2000 + b"]" * 2000 + b"]}", "depth"),
        (b'{"traces": [', "not valid JSON"),
        (b"\xff\xfe\x00", "not valid JSON"),
    ],
)
def test_bodies_that_are_not_strict_json_get_400(api, body, words):
    response = api.post(URL, body=body)
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_json"
    assert words in response.json()["detail"]


def test_a_body_without_traces_is_422_naming_it(api):
    response = api.post(URL, {"trace": []})
    assert response.status_code == 422
    assert response.json()["error"] == "invalid_request"
    assert "traces" in response.json()["detail"]


def test_a_body_over_the_size_limit_is_413_and_stores_nothing(api, settings):
    settings.INGEST_MAX_BODY_BYTES = 10_000
    big = make_trace("big", metadata={"blob": "x" * 20_000})
    response = api.post(URL, {"traces": [big]})
    assert response.status_code == 413
    assert response.json()["error"] == "payload_too_large"
    assert not Trace.objects.exists()


def test_too_many_traces_in_one_batch_is_413(api, settings):
    settings.INGEST_MAX_TRACES_PER_BATCH = 3
    response = api.post(URL, {"traces": [make_trace(f"t{i}") for i in range(4)]})
    assert response.status_code == 413
    assert "limit of 3" in response.json()["detail"]


def test_a_wrong_key_is_401(project):
    response = ApiClient("apk_not-a-key").post(URL, {"traces": [make_trace()]})
    assert response.status_code == 401
    assert response.json()["error"] == "unauthorized"
    assert not Trace.objects.exists()


def test_a_missing_key_is_401(project):
    assert ApiClient(None).get(URL).status_code == 401


def test_a_revoked_key_is_401(api, project):
    from reviewapp.projects.models import ApiKey
    from reviewapp.projects.services import revoke_api_key

    revoke_api_key(key=ApiKey.objects.get(project=project))
    assert api.get(URL).status_code == 401


def test_another_projects_key_sees_404_for_its_traces(api, other_api):
    api.post(URL, {"traces": [make_trace("mine")]})
    assert other_api.get(f"{URL}/mine").status_code == 404
    assert other_api.post(f"{URL}/mine/feedback", {"text": "x"}).status_code == 404
    assert other_api.post(f"{URL}/mine/outcome", {"reward": 0}).status_code == 404
    assert other_api.get(URL).json()["traces"] == []


def test_another_project_can_use_the_same_external_id(api, other_api, project, other_project):
    assert statuses(api.post(URL, {"traces": [make_trace("shared")]})) == [201]
    assert statuses(other_api.post(URL, {"traces": [make_trace("shared")]})) == [201]
    assert Trace.objects.filter(external_id="shared").count() == 2


def test_list_is_newest_first_with_a_cursor(api):
    api.post(URL, {"traces": [make_trace(f"t-{i}") for i in range(5)]})
    first = api.get(URL, limit=2).json()
    assert [t["external_id"] for t in first["traces"]] == ["t-4", "t-3"]
    second = api.get(URL, limit=2, cursor=first["next"]).json()
    assert [t["external_id"] for t in second["traces"]] == ["t-2", "t-1"]
    third = api.get(URL, limit=2, cursor=second["next"]).json()
    assert [t["external_id"] for t in third["traces"]] == ["t-0"]
    assert third["next"] is None


def test_list_filters_by_text_and_source(api):
    weather = make_trace("w")
    weather["messages"][1]["content"] = "Will it rain in Oslo?"
    api.post(URL, {"traces": [make_trace("c"), weather]})
    assert [t["external_id"] for t in api.get(URL, q="oslo").json()["traces"]] == ["w"]
    assert api.get(URL, source="otel").json()["traces"] == []
    assert len(api.get(URL, source="api").json()["traces"]) == 2


@pytest.mark.parametrize(
    "params", [{"limit": 0}, {"limit": 501}, {"cursor": "%%%"}, {"source": "nowhere"}]
)
def test_bad_list_parameters_are_4xx(api, params):
    response = api.get(URL, **params)
    assert 400 <= response.status_code < 500
    assert response.json()["error"]


def test_an_unknown_trace_is_404_json(api):
    response = api.get(f"{URL}/nope")
    assert response.status_code == 404
    assert response.json() == {"error": "not_found", "detail": "no trace 'nope' in this project"}


def test_the_stored_body_is_compressed(api, project):
    trace = make_trace("big", metadata={})
    trace["messages"][1]["content"] = "please repeat this " * 500
    api.post(URL, {"traces": [copy.deepcopy(trace)]})
    stored = Trace.objects.get(project=project)
    assert len(bytes(stored.body)) < len(trace["messages"][1]["content"]) / 10
