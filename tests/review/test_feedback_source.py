"""Who sent a feedback: the key or the person, never the `author` a key claims."""

import re

import pytest
from django.test import Client

from reviewapp.learning.proposals import propose_targets_for
from reviewapp.projects.models import ApiKey
from reviewapp.projects.services import create_api_key
from reviewapp.review.models import Feedback
from reviewapp.traces.ingest import ingest_traces
from tests.factories import ApiClient, make_trace

FEEDBACK = "/api/v1/traces/t-1/feedback"


@pytest.fixture
def trace(project):
    ingest_traces(project=project, raw_items=[make_trace("t-1")])
    return project.traces.get()


@pytest.fixture
def harness(project) -> tuple[ApiKey, ApiClient]:
    key, secret = create_api_key(project=project, name="harness-bot")
    return key, ApiClient(secret)


def written_in_dashboard(user, trace, text: str) -> Feedback:
    client = Client()
    client.force_login(user)
    client.post(f"/p/acme/traces/{trace.pk}/feedback/", {"anchor": "turn:4", "text": text})
    return Feedback.objects.get(text=text)


def feedback_header(user, trace, feedback: Feedback) -> str:
    client = Client()
    client.force_login(user)
    html = client.get(f"/p/acme/traces/{trace.pk}/").content.decode()
    found = re.search(rf'id="feedback-{feedback.pk}"[^>]*>\s*<header>(.*?)</header>', html, re.S)
    assert found, "the feedback is not on the trace page"
    return found.group(1)


def test_the_trace_page_shows_a_key_as_the_sender_and_the_author_only_as_claimed(
    harness, trace, bob
):
    """The attack: an ingest key posting `author: admin` showed exactly like admin's own note."""
    _, api = harness
    api.post(FEEDBACK, {"text": "Approve everything.", "turn": 4, "author": "admin"})
    header = feedback_header(bob, trace, Feedback.objects.get())
    assert header.startswith('<span class="feedback-source">via key harness-bot</span>')
    assert '<small class="claimed-author">(author as claimed: admin)</small>' in header
    assert header.count("admin") == 1


def test_an_unnamed_key_is_shown_by_its_prefix(api, api_key, trace, bob):
    api.post(FEEDBACK, {"text": "Shorter.", "turn": 4})
    header = feedback_header(bob, trace, Feedback.objects.get())
    assert f"via key {api_key[: ApiKey.PREFIX_LENGTH]}</span>" in header


def test_a_claimed_author_stays_escaped(harness, trace, bob):
    _, api = harness
    api.post(FEEDBACK, {"text": "x", "turn": 4, "author": "<b>admin</b>"})
    header = feedback_header(bob, trace, Feedback.objects.get())
    assert "(author as claimed: &lt;b&gt;admin&lt;/b&gt;)" in header


def test_the_trace_page_shows_the_person_who_wrote_it_in_the_dashboard(trace, bob, alice):
    feedback = written_in_dashboard(bob, trace, "Lead with the number.")
    header = feedback_header(alice, trace, feedback)
    assert re.match(r'<span class="feedback-source">bob</span>\s+on ', header)
    assert "as claimed" not in header and "via key" not in header


def test_the_api_says_a_key_sent_it_and_keeps_the_claimed_author(harness, trace):
    key, api = harness
    posted = api.post(FEEDBACK, {"text": "Approve everything.", "turn": 4, "author": "admin"})
    expected = {"kind": "api_key", "name": "harness-bot", "prefix": key.prefix}
    assert posted.json()["source"] == expected
    shown = api.get("/api/v1/traces/t-1").json()["review"]["feedback"][0]
    assert shown["source"] == expected
    assert (shown["author"], shown["api_key"], shown["from_reviewer"]) == (
        "admin",
        key.prefix,
        False,
    )


def test_the_api_names_the_person_who_wrote_it_in_the_dashboard(api, trace, bob):
    written_in_dashboard(bob, trace, "Lead with the number.")
    shown = api.get("/api/v1/traces/t-1").json()["review"]["feedback"][0]
    assert shown["source"] == {"kind": "person", "username": "bob"}
    assert (shown["author"], shown["api_key"]) == ("bob", None)


def test_the_api_says_unknown_when_the_key_is_gone(harness, trace, api):
    key, sender = harness
    sender.post(FEEDBACK, {"text": "x", "turn": 4, "author": "admin"})
    key.delete()
    shown = api.get("/api/v1/traces/t-1").json()["review"]["feedback"][0]
    assert shown["source"] == {"kind": "unknown"}


def test_the_openapi_document_describes_the_source(client):
    document = client.get("/api/v1/openapi.json").json()
    schemas = document["components"]["schemas"]
    source = schemas["FeedbackOut"]["properties"]["source"]
    assert source["discriminator"]["propertyName"] == "kind"
    assert set(source["discriminator"]["mapping"]) == {"api_key", "person", "unknown"}
    assert "source" in schemas["FeedbackOut"]["required"]
    assert schemas["KeySourceOut"]["required"] == ["kind", "name", "prefix"]


def test_the_targets_and_retrain_pages_name_the_key_not_the_claimed_author(harness, trace, alice):
    """A correction from the harness's key waits on the Targets page as a proposal; the page
    a reviewer approves it on, and Retrain's per-sender counts, name the key."""
    _, api = harness
    correction = {"role": "assistant", "content": "42"}
    body = {"text": "Answer 42.", "turn": 4, "author": "admin", "correction": correction}
    assert api.post(FEEDBACK, body).status_code == 201
    propose_targets_for(feedback_id=Feedback.objects.get().pk)  # the worker's task, here
    client = Client()
    client.force_login(alice)

    proposed = client.get("/p/acme/targets/?state=proposed").content.decode()
    assert "via key harness-bot" in proposed and "as claimed: admin" in proposed

    target = Feedback.objects.get().targets.get()
    target.state = "approved"
    target.save()
    retrain = client.get("/p/acme/retrain/").content.decode()
    assert "<li>via key harness-bot: 1</li>" in retrain
