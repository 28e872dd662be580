"""The review API: tags on a trace, queues and their items, under review-scoped keys."""

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from reviewapp.api.app import api as ninja_api
from reviewapp.projects.services import create_api_key
from reviewapp.review.models import Queue, QueueItem, QueueReview, ReviewStatus
from reviewapp.traces.ingest import ingest_traces
from reviewapp.traces.models import Tag, TraceTag
from tests.factories import ApiClient, make_trace

REVIEW_ROUTES = [
    ("post", "/api/v1/traces/{external_id}/tags"),
    ("get", "/api/v1/queues"),
    ("get", "/api/v1/queues/{queue_id}/items"),
]


@pytest.fixture
def stored(project):
    ingest_traces(project=project, raw_items=[make_trace("t-1"), make_trace("t-2")])
    return project.traces.get(external_id="t-1")


@pytest.fixture
def globex_reviewer(other_project) -> ApiClient:
    return ApiClient(create_api_key(project=other_project, scopes=["review"])[1])


@pytest.mark.parametrize(("method", "path"), REVIEW_ROUTES)
def test_the_harness_key_is_refused_every_review_route_naming_the_scope(api, method, path):
    url = path.format(external_id="t-1", queue_id=1)
    response = getattr(api, method)(url, **({} if method == "get" else {"payload": {}}))
    assert response.status_code == 403
    assert response.json()["error"] == "insufficient_scope"
    assert "'review'" in response.json()["detail"]


def test_review_routes_are_in_the_openapi_document():
    paths = ninja_api.get_openapi_schema()["paths"]
    for method, path in REVIEW_ROUTES:
        assert method in paths[path], path


def test_tags_are_added_and_the_taxonomy_grows(review_api, stored, project):
    Tag.objects.create(project=project, name="wrong-tool")
    response = review_api.post(
        "/api/v1/traces/t-1/tags", {"add": ["wrong-tool", "tools / timeout"]}
    )
    assert response.status_code == 200
    assert response.json() == {
        "tags": ["tools / timeout", "wrong-tool"],
        "added": ["wrong-tool", "tools / timeout"],
        "removed": [],
    }
    assert Tag.objects.filter(project=project, name="tools / timeout").exists()
    again = review_api.post("/api/v1/traces/t-1/tags", {"add": ["wrong-tool"]})
    assert again.json()["added"] == []  # already on: nothing changes
    assert TraceTag.objects.filter(trace=stored).count() == 2


def test_removing_a_tag_takes_off_the_keys_tag_but_not_a_persons(review_api, stored, bob):
    tag = Tag.objects.create(project=stored.project, name="too-verbose")
    review_api.post("/api/v1/traces/t-1/tags", {"add": ["too-verbose"]})
    TraceTag.objects.create(trace=stored, tag=tag, reviewer=bob)
    response = review_api.post("/api/v1/traces/t-1/tags", {"remove": ["too-verbose"]})
    assert response.status_code == 200
    assert response.json()["removed"] == ["too-verbose"]
    assert response.json()["tags"] == ["too-verbose"]  # bob's stays: his judgement is his
    assert list(TraceTag.objects.filter(trace=stored).values_list("reviewer", flat=True)) == [
        bob.pk
    ]


def test_removing_a_tag_the_taxonomy_lacks_is_404_naming_it(review_api, stored):
    response = review_api.post("/api/v1/traces/t-1/tags", {"remove": ["no-such-tag"]})
    assert response.status_code == 404
    assert "'no-such-tag'" in response.json()["detail"]


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"add": [""]}, "1-100 characters"),
        ({"add": ["x" * 101]}, "1-100 characters"),
        ({"add": ["a\x00b"]}, "NUL"),
        ({"add": "wrong-tool"}, "add"),
        ({"add": ["same"], "remove": ["same"]}, "both added and removed"),
    ],
)
def test_bad_tag_changes_are_422_naming_the_problem(review_api, stored, changes, named):
    response = review_api.post("/api/v1/traces/t-1/tags", changes)
    assert response.status_code == 422
    assert named in response.json()["detail"]
    assert not TraceTag.objects.filter(trace=stored).exists()


def test_tags_on_an_unknown_trace_are_404(review_api, stored):
    response = review_api.post("/api/v1/traces/nope/tags", {"add": ["x"]})
    assert response.status_code == 404
    assert not Tag.objects.filter(name="x").exists()


@pytest.fixture
def queue(project, stored, alice):
    queue = Queue.objects.create(
        project=project, name="Tool errors", filter_query="termination=tool_error",
        reviewers_per_item=1, created_by=alice,
    )  # fmt: skip
    first = QueueItem.objects.create(queue=queue, trace=stored, position=1)
    QueueItem.objects.create(queue=queue, trace=project.traces.get(external_id="t-2"), position=2)
    QueueReview.objects.create(
        item=first, reviewer=alice, status=ReviewStatus.DONE,
        reserved_until=timezone.now(), done_at=timezone.now(),
    )  # fmt: skip
    return queue


def test_queues_are_listed_with_their_progress(review_api, queue):
    response = review_api.get("/api/v1/queues")
    assert response.status_code == 200
    [listed] = response.json()["queues"]
    assert listed["id"] == queue.pk
    assert listed["name"] == "Tool errors"
    assert listed["filter_query"] == "termination=tool_error"
    assert (listed["items"], listed["fully_reviewed"]) == (2, 1)


def test_a_queues_items_come_in_order_with_their_reviews_and_page(review_api, queue):
    response = review_api.get(f"/api/v1/queues/{queue.pk}/items", limit=1)
    assert response.status_code == 200
    [first] = response.json()["items"]
    assert first["position"] == 1 and first["trace"] == "t-1"
    assert [(r["reviewer"], r["status"]) for r in first["reviews"]] == [("alice", "done")]
    rest = review_api.get(f"/api/v1/queues/{queue.pk}/items", cursor=response.json()["next"])
    assert [item["trace"] for item in rest.json()["items"]] == ["t-2"]
    assert rest.json()["next"] is None


def test_another_projects_queue_is_404(queue, globex_reviewer):
    assert globex_reviewer.get(f"/api/v1/queues/{queue.pk}/items").status_code == 404
    assert globex_reviewer.get("/api/v1/queues").json() == {"queues": []}


def test_an_admin_only_key_reads_queues_but_cannot_tag(project, queue):
    admin_only = ApiClient(create_api_key(project=project, scopes=["admin"])[1])
    assert admin_only.get("/api/v1/queues").status_code == 200
    assert admin_only.post("/api/v1/traces/t-1/tags", {"add": ["x"]}).status_code == 403
    assert get_user_model().objects.count() == 1  # alice; a key makes no user


def test_another_projects_trace_cannot_be_tagged(stored, globex_reviewer):
    response = globex_reviewer.post("/api/v1/traces/t-1/tags", {"add": ["spam"]})
    assert response.status_code == 404
    assert not TraceTag.objects.exists()
    assert not Tag.objects.filter(name="spam").exists()
