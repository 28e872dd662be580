"""Every route, tried with another project's credentials: mallory (a member of globex only) on
acme's dashboard pages and partials, and globex's API key on acme's API objects.

The routes come from the URLconf and the OpenAPI document, so a new route is covered (or, if it
takes a parameter this file cannot fill, fails here until someone says how to fill it).
"""

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

from reviewapp.api.app import api
from reviewapp.learning.models import Adapter, DistillationTarget, TargetState, TrainingRun
from reviewapp.monitors.models import TriageRule
from reviewapp.projects.invitations import create_invitation
from reviewapp.projects.models import ApiKey, Membership
from reviewapp.review.feedback import delete_feedback_with_undo, record_feedback
from reviewapp.review.models import Queue, QueueItem
from reviewapp.traces.ingest import ingest_traces
from reviewapp.traces.models import Tag
from reviewapp.traces.saved_views import save_view
from tests.factories import ApiClient, make_trace

SECRET_MARKER = "acme-confidential-7f3a"  # in acme's data; must never reach globex
# Routes that address no project's objects, and why they need no cross-project check.
UNSCOPED_ROUTES = {
    "home": "lists the projects the user is a member of",
    "login": "public",
    "logout": "public",
    "invitation_accept": "the one-time token is the credential and names its own project",
    "gateway_chat": "scoped by the key alone; it addresses no stored object",
    "gateway_models": "scoped by the key alone (checked below)",
    "openapi-json": "public document",
    "openapi-view": "public document",
    "api-root": "no content",
}


def _routes(patterns, prefix=""):
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            if str(pattern.pattern) == "admin/":
                continue  # Django's admin: staff only, none of our users is staff
            yield from _routes(pattern.url_patterns, prefix + str(pattern.pattern))
        elif isinstance(pattern, URLPattern):
            yield prefix + str(pattern.pattern), pattern.name, pattern


DASHBOARD_ROUTES = [
    (route, name)
    for route, name, _ in _routes(get_resolver().url_patterns)
    if "<slug:slug>" in route
]
OTHER_ROUTES = [
    name
    for route, name, _ in _routes(get_resolver().url_patterns)
    if "<slug:slug>" not in route and not route.startswith("api/v1/")
]
API_OPERATIONS = [
    (method.upper(), path)
    for path, operations in api.get_openapi_schema()["paths"].items()
    for method in operations
]


@pytest.fixture
def acme_objects(project, alice, bob, other_project):
    """One of everything in acme, each carrying the marker where it holds text."""
    project.served_model = f"{SECRET_MARKER}-model"
    project.save()
    ingest_traces(
        project=project,
        raw_items=[make_trace("acme-trace", metadata={"note": SECRET_MARKER})],
    )
    trace = project.traces.get()
    tag = Tag.objects.create(project=project, name=f"{SECRET_MARKER}-tag")
    feedback, _ = record_feedback(trace=trace, text=f"{SECRET_MARKER} feedback", turn=4)
    key = ApiKey.objects.create(project=project, prefix="apk_acme", secret_hash="0" * 64)
    queue = Queue.objects.create(project=project, name=f"{SECRET_MARKER} queue", created_by=alice)
    item = QueueItem.objects.create(queue=queue, trace=trace, position=0)
    target = DistillationTarget.objects.create(
        feedback=feedback,
        turn=4,
        source="correction",
        student_context=[],
        target={"role": "assistant", "content": SECRET_MARKER},
        state=TargetState.PROPOSED,
    )
    run = TrainingRun.objects.create(project=project, config={}, status="trained")
    adapter = Adapter.objects.create(
        project=project, version=1, name="acme-v1", path="/nonexistent", base_model="b",
        checksum="0", run=run,
    )  # fmt: skip
    rule = TriageRule.objects.create(project=project, name=f"{SECRET_MARKER} rule", queue=queue)
    gone, _ = record_feedback(trace=trace, text=f"{SECRET_MARKER} deleted", turn=4, reviewer=bob)
    deleted = delete_feedback_with_undo(feedback=gone, deleted_by=alice)  # hers to undo
    invitation = create_invitation(
        project=project, invitee=f"{SECRET_MARKER}@example.com", role="admin", invited_by=alice
    )[0]
    view = save_view(
        project=project, owner=bob, name=f"{SECRET_MARKER} view", query="q=x", shared=True
    )
    return {
        "slug": project.slug,
        "trace_id": trace.pk,
        "tag_id": tag.pk,
        "feedback_id": feedback.pk,
        "key_id": key.pk,
        "queue_id": queue.pk,
        "item_id": item.pk,
        "target_id": target.pk,
        "run_id": run.pk,
        "version": adapter.version,
        "rule_id": rule.pk,
        "invitation_id": invitation.pk,
        "deleted_id": deleted.pk,
        "external_id": trace.external_id,
        "member_id": Membership.objects.get(project=project, user=bob).pk,
        "view_id": view.pk,
    }


def _fill(route: str, objects: dict) -> str:
    path = "/" + route
    for converter in ("slug", "int", "str", "path"):
        path = path.replace(f"<{converter}:", "<")
    for name, value in objects.items():
        path = path.replace(f"<{name}>", str(value)).replace(f"{{{name}}}", str(value))
    assert "<" not in path and "{" not in path, (
        f"{route}: add the object for this parameter to acme_objects"
    )
    return path


def test_every_route_is_classified():
    """A new route outside /p/<slug>/ and the API has to say why it needs no check."""
    assert set(OTHER_ROUTES) <= set(UNSCOPED_ROUTES), set(OTHER_ROUTES) - set(UNSCOPED_ROUTES)


# 405: the view takes no such method, whoever asks; nothing was looked up.
REFUSED = (403, 404, 405)


def test_mallory_gets_nothing_from_any_dashboard_page_or_partial(acme_objects, mallory):
    client = Client()
    client.force_login(mallory)
    for route, _ in DASHBOARD_ROUTES:
        path = _fill(route, acme_objects)
        for method in ("get", "post"):
            for htmx in ({}, {"HX-Request": "true"}):  # the page and its partials
                response = getattr(client, method)(path, headers=htmx)
                assert response.status_code in REFUSED, (method, path, htmx, response.status_code)
                assert SECRET_MARKER.encode() not in response.content


def test_alice_reaches_every_dashboard_route_so_the_refusals_mean_something(acme_objects, alice):
    client = Client()
    client.force_login(alice)
    for route, _ in DASHBOARD_ROUTES:
        path = _fill(route, acme_objects)
        response = client.get(path)
        if response.status_code == 405:  # a POST-only action: its GET says nothing
            response = client.post(path)
        assert response.status_code not in (403, 404), (path, response.status_code)


@pytest.fixture(params=["ingest", "every scope"])
def globex_api(request, other_project) -> ApiClient:
    """globex's harness key, and one that holds every scope: a scope refusal (403) must not be
    the only thing keeping a route from acme's objects."""
    from reviewapp.projects.services import create_api_key

    scopes = ["ingest"] if request.param == "ingest" else ["ingest", "review", "admin"]
    return ApiClient(create_api_key(project=other_project, scopes=scopes)[1])


def test_another_projects_key_reaches_nothing_of_acme_over_the_api(acme_objects, globex_api):
    other_api = globex_api
    for method, path in API_OPERATIONS:
        url = _fill(path.removeprefix("/"), acme_objects)
        # a body every operation accepts, so the answer is about the object, not the body
        body = {"text": "x", "traces": [], "reward": 1, "content": "x"}
        response = other_api.request(method, url, body)
        if "{" in path:  # addresses one of acme's objects
            assert response.status_code in (403, 404), (method, url, response.status_code)
        else:  # a collection: answered for globex, with nothing of acme in it
            assert response.status_code < 500, (method, url, response.status_code)
        body = b"".join(response.streaming_content) if response.streaming else response.content
        assert SECRET_MARKER.encode() not in body, (method, url)


def test_acme_key_reaches_acme_objects_over_the_api(acme_objects, api):
    response = api.get(f"/api/v1/traces/{acme_objects['external_id']}")
    assert response.status_code == 200
    assert SECRET_MARKER in response.content.decode()


def test_another_projects_key_lists_only_its_own_model_on_the_gateway(acme_objects, other_api):
    response = other_api.get("/v1/models")
    assert response.status_code == 200
    assert SECRET_MARKER not in response.content.decode()


def test_a_user_with_no_membership_is_refused_everywhere(acme_objects, db):
    stranger = get_user_model().objects.create_user("stranger", password="correct horse battery")
    client = Client()
    client.force_login(stranger)
    for route, _ in DASHBOARD_ROUTES:
        assert client.get(_fill(route, acme_objects)).status_code in REFUSED, route


def test_no_key_gets_401_on_every_api_operation(acme_objects):
    anonymous = ApiClient(None)
    for method, path in API_OPERATIONS:
        if path.endswith("openapi.json"):
            continue
        url = _fill(path.removeprefix("/"), acme_objects)
        response = anonymous.request(method, url, {})
        assert response.status_code == 401, (method, url, response.status_code)
