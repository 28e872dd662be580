"""Every dashboard URL, for every role and for someone signed out: each answers as it should
(a page 200 to those who may read it, 403 to a member who may not, a login redirect to the
signed-out, 404 to another project's member), and none answers 500. The URLs come from
reviewapp.urls, so a new page that is not listed here fails the test."""

import pytest
from django.test import Client
from django.urls import URLPattern, reverse

from reviewapp import urls
from reviewapp.learning.models import (
    Adapter,
    DistillationTarget,
    RunStatus,
    TargetState,
    TrainingRun,
)
from reviewapp.monitors.models import TriageRule
from reviewapp.projects.invitations import create_invitation
from reviewapp.projects.models import Membership
from reviewapp.projects.services import create_api_key
from reviewapp.review.feedback import (
    delete_feedback_with_undo,
    mark_feedback_failed,
    record_feedback,
)
from reviewapp.review.queues import build_queue
from reviewapp.traces.ingest import ingest_traces
from reviewapp.traces.models import Tag
from reviewapp.traces.saved_views import save_view
from tests.factories import make_trace

RANK = {"viewer": 0, "reviewer": 1, "admin": 2}

# Pages read with GET, and the least role that may read them.
PAGES = {
    "trace_list": "viewer",
    "trace_detail": "viewer",
    "trace_similar": "viewer",
    "triage_rules": "viewer",
    "triage_rule_edit": "admin",
    "failure_clusters": "viewer",
    "tag_list": "viewer",
    "api_keys": "admin",
    "members": "admin",
    "project_settings": "admin",
    "queue_list": "viewer",
    "queue_create": "admin",
    "queue_detail": "viewer",
    "queue_agreement": "viewer",
    "target_list": "viewer",
    "retrain": "viewer",
    "run_detail": "viewer",
    "adapter_list": "viewer",
    "adapter_detail": "viewer",
    "monitors": "viewer",
    "dataset": "viewer",
}
# What a POST changes, and the least role that may change it: routes that only take POST, and
# pages whose form posts back to them.
ACTIONS = {
    "trace_toggle_tag": "reviewer",
    "trace_undo_untag": "reviewer",
    "trace_add_feedback": "reviewer",
    "feedback_delete": "reviewer",
    "feedback_undo_delete": "reviewer",
    "feedback_retry": "admin",
    "feedback_correct": "reviewer",
    "saved_view_create": "reviewer",
    "saved_view_delete": "reviewer",
    "traces_bulk_tag": "reviewer",
    "traces_bulk_queue": "admin",
    "traces_bulk_feedback": "reviewer",
    "trace_apply_feedback": "reviewer",
    "triage_rule_run": "admin",
    "tag_rename": "admin",
    "tag_merge": "admin",
    "tag_delete": "admin",
    "api_key_revoke": "admin",
    "member_role": "admin",
    "member_remove": "admin",
    "invitation_create": "admin",
    "invitation_revoke": "admin",
    "queue_next": "reviewer",
    "queue_item_done": "reviewer",
    "queue_item_release": "admin",
    "queue_item_reassign": "admin",
    "queue_guidelines": "admin",
    "target_policy": "admin",
    "target_choice": "reviewer",
    "target_approve_passing": "reviewer",
    "run_cancel": "admin",
    "adapter_deploy": "admin",
    "adapter_promote": "admin",
    "adapter_share": "admin",
    "adapter_rollback": "admin",
    # pages that also take a POST
    "triage_rules": "admin",
    "triage_rule_edit": "admin",
    "tag_list": "admin",
    "api_keys": "admin",
    "project_settings": "admin",
    "queue_create": "admin",
    "retrain": "admin",
    "dataset": "admin",
}
POST_ONLY = set(ACTIONS) - set(PAGES)
# Not dashboard pages, each tested where it lives: sign-in, joining by an invitation
# (tests/projects/test_views_invitations.py), the admin site, the JSON API and the gateway.
ELSEWHERE = {"home", "login", "logout", "invitation_accept", "gateway_chat", "gateway_models"}


def _named_patterns() -> list[URLPattern]:
    """The URL patterns reviewapp.urls names itself (the admin site and the API are includes)."""
    return [pattern for pattern in urls.urlpatterns if isinstance(pattern, URLPattern)]


def test_every_url_of_the_dashboard_is_walked():
    names = {pattern.name for pattern in _named_patterns()}
    assert None not in names, "a dashboard URL without a name cannot be walked"
    assert names - set(PAGES) - POST_ONLY - ELSEWHERE == set(), "add it to PAGES or ACTIONS"
    assert set(PAGES) | POST_ONLY | ELSEWHERE <= names, "a listed URL no longer exists"


@pytest.fixture
def url_arguments(project, alice, bob, victor) -> dict:
    """One of everything a dashboard URL can name, in the acme project."""
    ingest_traces(project=project, raw_items=[make_trace("t-1"), make_trace("t-2")])
    trace = project.traces.get(external_id="t-1")
    tag = Tag.objects.create(project=project, name="wrong-answer")
    Tag.objects.create(project=project, name="bad-arguments")
    feedback, _ = record_feedback(trace=trace, text="Lead with the number.", turn=4, reviewer=bob)
    failed, _ = record_feedback(trace=trace, text="Say it in French.", turn=4, reviewer=bob)
    mark_feedback_failed(feedback_id=failed.pk, reason="none of the teacher's revisions passed")
    target = DistillationTarget.objects.create(
        feedback=feedback,
        turn=4,
        source="hint",
        student_context=trace.body_json()["messages"][:4],
        original=trace.body_json()["messages"][4],
        target={"role": "assistant", "content": "84."},
        state=TargetState.APPROVED,
    )
    queue = build_queue(
        project=project, name="Weekly", filters={}, filter_query="", sample_size=None,
        seed=None, reviewers_per_item=1, blind=False, assignees=[], created_by=alice,
    )  # fmt: skip
    rule = TriageRule.objects.create(project=project, name="Timeouts", queue=queue)
    run = TrainingRun.objects.create(
        project=project, config={"mode": "sft"}, status=RunStatus.TRAINED, created_by=alice
    )
    run.targets.add(target)
    adapter = Adapter.objects.create(
        project=project, version=1, name="acme-v1", path="/adapters/acme-v1",
        base_model="SmolLM2-135M-Instruct", checksum="0" * 64, run=run, eval_results={},
    )  # fmt: skip
    key = create_api_key(project=project)[0]
    invitation = create_invitation(
        project=project, invitee="dana", role="viewer", invited_by=alice
    )[0]
    gone, _ = record_feedback(trace=trace, text="Shorter.", turn=4, reviewer=bob)
    deleted = delete_feedback_with_undo(feedback=gone, deleted_by=bob)
    view = save_view(
        project=project, owner=bob, name="Timeouts", query="termination=timeout", shared=True
    )
    return {
        "slug": project.slug,
        "trace_id": trace.pk,
        "tag_id": tag.pk,
        "feedback_id": failed.pk,
        "deleted_id": deleted.pk,
        "key_id": key.pk,
        "invitation_id": invitation.pk,
        "member_id": Membership.objects.get(user=victor).pk,
        "queue_id": queue.pk,
        "item_id": queue.items.order_by("id").first().pk,
        "rule_id": rule.pk,
        "run_id": run.pk,
        "version": adapter.version,
        "view_id": view.pk,
    }


def _url(name: str, arguments: dict) -> str:
    (pattern,) = [pattern for pattern in _named_patterns() if pattern.name == name]
    needed = pattern.pattern.converters
    return reverse(name, kwargs={key: arguments[key] for key in needed})


def _client(user=None) -> Client:
    client = Client()
    if user is not None:
        client.force_login(user)
    return client


@pytest.mark.parametrize("name", sorted(PAGES))
def test_each_page_answers_each_role_as_it_should(name, url_arguments, alice, bob, victor, mallory):
    url = _url(name, url_arguments)
    least = RANK[PAGES[name]]
    for role, user in (("admin", alice), ("reviewer", bob), ("viewer", victor)):
        response = _client(user).get(url)
        expected = 200 if RANK[role] >= least else 403
        assert response.status_code == expected, f"{role} GET {url}"
    signed_out = _client().get(url)
    assert signed_out.status_code == 302 and signed_out["Location"].startswith("/login/?next=")
    assert _client(mallory).get(url).status_code == 404, f"another project's member GET {url}"


@pytest.mark.parametrize("name", sorted(ACTIONS))
def test_each_action_refuses_who_may_not_and_never_fails_on_an_empty_form(
    name, url_arguments, alice, bob, victor, mallory
):
    url = _url(name, url_arguments)
    least = RANK[ACTIONS[name]]
    users = {"admin": alice, "reviewer": bob, "viewer": victor}
    for role, user in users.items():
        if RANK[role] < least:
            assert _client(user).post(url).status_code == 403, f"{role} POST {url}"
    signed_out = _client().post(url)
    assert signed_out.status_code == 302 and signed_out["Location"].startswith("/login/?next=")
    assert _client(mallory).post(url).status_code == 404, f"another project's member POST {url}"
    if name in POST_ONLY:
        assert _client(alice).get(url).status_code == 405
    # The least role that may: an empty form is a 4xx naming the problem, or does what it says.
    allowed = next(user for role, user in users.items() if RANK[role] == least)
    response = _client(allowed).post(url, headers={"HX-Request": "true"})
    assert response.status_code < 500, f"{ACTIONS[name]} POST {url}"


def test_signed_out_visitors_are_sent_to_sign_in_and_members_home(alice):
    assert _client().get("/login/").status_code == 200
    assert _client().get("/")["Location"].startswith("/login/")
    assert _client(alice).get("/")["Location"] == "/p/acme/traces/"


def test_pages_empty_in_a_new_project_say_what_to_do(project, alice, victor):
    adapters = _client(victor).get("/p/acme/adapters/").content.decode()
    assert "Retrain to see this" in adapters and 'href="/p/acme/retrain/">Retrain</a>' in adapters
    assert "(an admin starts it)" in adapters
    retrain = _client(alice).get("/p/acme/retrain/").content.decode()
    assert "Nothing is approved yet" in retrain and 'href="/p/acme/targets/"' in retrain
    assert "No runs yet. Retrain above to start one" in retrain
    targets = _client(victor).get("/p/acme/targets/").content.decode()
    assert "No proposals wait for a choice" in targets and 'href="/p/acme/traces/"' in targets


def test_a_run_page_before_its_first_step_says_why_it_is_blank(project, alice):
    queued = TrainingRun.objects.create(project=project, config={})
    page = _client(alice).get(f"/p/acme/runs/{queued.pk}/").content.decode()
    assert "the run waits for a worker on the gpu queue" in page and "<polyline" not in page
    failed = TrainingRun.objects.create(
        project=project, config={}, status=RunStatus.FAILED, error="out of memory"
    )
    page = _client(alice).get(f"/p/acme/runs/{failed.pk}/").content.decode()
    assert "This run ended before any training step: see the error above" in page
