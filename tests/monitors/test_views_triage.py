"""The triage pages: rules, clusters, and "more like this" with suggested tags on a trace."""

import numpy as np
import pytest
from django.test import Client

from reviewapp import jobs
from reviewapp.monitors import embeddings as similarity
from reviewapp.monitors.models import TraceEmbedding, TriageRule
from reviewapp.monitors.triage import route_traces
from reviewapp.review.feedback import record_feedback
from reviewapp.review.models import CopiedFeedback, Feedback, Queue
from reviewapp.traces.ingest import ingest_traces
from reviewapp.traces.models import Tag, Trace, TraceTag
from tests.factories import make_trace


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def traces(project) -> dict[str, Trace]:
    """t-0 timed out; t-1 and t-2 point the same way as t-0, t-3 elsewhere; all embedded."""
    items = [make_trace(f"t-{i}") for i in range(4)]
    items[0]["termination"] = "timeout"
    ingest_traces(project=project, raw_items=items)
    stored = {trace.external_id: trace for trace in project.traces.all()}
    directions = {"t-0": [1, 0], "t-1": [0.9, 0.1], "t-2": [0.8, 0.3], "t-3": [0, 1]}
    for external_id, values in directions.items():
        vector = np.zeros(similarity.DIMENSIONS, dtype=np.float32)
        vector[:2] = values
        vector /= np.linalg.norm(vector)
        TraceEmbedding.objects.create(
            project=project,
            trace=stored[external_id],
            model_name=similarity.MODEL_NAME,
            vector=similarity.to_bytes(vector),
            content_hash="by hand",
        )
    return stored


@pytest.fixture
def queue(project):
    return Queue.objects.create(project=project, name="timeouts")


@pytest.fixture
def rule(project, queue):
    return TriageRule.objects.create(
        project=project, name="Timeouts", queue=queue, termination="timeout"
    )


def rule_form(queue, **fields) -> dict:
    return {
        "name": "Slow tools",
        "queue": queue.pk,
        "sample_rate": "0.5",
        "enabled": "on",
        **fields,
    }


def test_it_shows_every_member_the_rules_and_their_counts(traces, rule, victor):
    route_traces(rule=rule)

    response = logged_in(victor).get("/p/acme/triage/")

    assert response.status_code == 200
    row = response.content.decode().split(f'id="rule-{rule.pk}"')[1].split("</tr>")[0]
    assert "termination is timeout" in row
    assert '<td class="matched">1</td>' in row and '<td class="routed">1</td>' in row
    assert "run now" not in row  # a viewer only reads
    assert 'id="rule-form"' not in response.content.decode()


def test_it_hides_the_rules_from_another_projects_member(rule, mallory):
    client = logged_in(mallory)
    assert client.get("/p/acme/triage/").status_code == 404
    assert client.get(f"/p/acme/triage/rules/{rule.pk}/").status_code == 404
    assert client.post(f"/p/acme/triage/rules/{rule.pk}/run/").status_code == 404
    assert (
        client.post("/p/acme/triage/", rule_form(rule.queue, min_tool_calls=3)).status_code == 404
    )
    # mallory's own project cannot reach acme's rule either
    assert client.get(f"/p/globex/triage/rules/{rule.pk}/").status_code == 404


def test_it_lets_an_admin_add_a_rule(alice, queue):
    response = logged_in(alice).post(
        "/p/acme/triage/", rule_form(queue, failed_tool="search", min_tool_calls="2")
    )

    assert response.status_code == 302
    rule = TriageRule.objects.get()
    assert (rule.failed_tool, rule.min_tool_calls, rule.sample_rate) == ("search", 2, 0.5)
    assert rule.queue == queue and rule.created_by == alice


def test_it_makes_a_new_queue_for_a_rule(alice, project):
    form = {"name": "Refunds", "new_queue": "Refund talk", "text": "refund", "sample_rate": "1"}

    response = logged_in(alice).post("/p/acme/triage/", form, headers={"HX-Request": "true"})

    assert response.status_code == 200
    assert response["HX-Redirect"] == "/p/acme/triage/"
    assert TriageRule.objects.get().queue == Queue.objects.get(project=project, name="Refund talk")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({}, "a rule needs at least one condition"),
        ({"text": "x", "sample_rate": "0"}, "a sample rate is above 0 and at most 1"),
        ({"text": "x", "sample_rate": "nan"}, "Enter a number."),
        ({"text": "x", "new_queue": "another"}, "choose a queue or name a new one"),
        ({"min_tool_calls": "-1"}, "greater than or equal to 0"),
    ],
)
def test_it_rejects_a_bad_rule_with_422(alice, queue, fields, message):
    response = logged_in(alice).post(
        "/p/acme/triage/", rule_form(queue, **fields), headers={"HX-Request": "true"}
    )

    assert response.status_code == 422
    assert message in response.content.decode()
    assert response.content.decode().lstrip().startswith('<form id="rule-form"')
    assert not TriageRule.objects.exists()


def test_it_does_not_route_to_another_projects_queue(alice, mallory, other_project):
    theirs = Queue.objects.create(project=other_project, name="theirs")

    response = logged_in(alice).post("/p/acme/triage/", rule_form(theirs, text="x"))

    assert response.status_code == 422
    assert not TriageRule.objects.exists()


def test_it_lets_only_admins_write_rules(bob, victor, queue, rule):
    for user in (bob, victor):
        client = logged_in(user)
        assert client.post("/p/acme/triage/", rule_form(queue, text="x")).status_code == 403
        assert client.get(f"/p/acme/triage/rules/{rule.pk}/").status_code == 403
        edit = client.post(f"/p/acme/triage/rules/{rule.pk}/", rule_form(queue, text="x"))
        assert edit.status_code == 403
        assert client.post(f"/p/acme/triage/rules/{rule.pk}/run/").status_code == 403
    assert TriageRule.objects.get().name == "Timeouts"


def test_it_lets_an_admin_disable_a_rule(alice, rule, queue):
    form = rule_form(queue, termination="timeout")
    del form["enabled"]

    response = logged_in(alice).post(f"/p/acme/triage/rules/{rule.pk}/", form)

    assert response.status_code == 302
    rule.refresh_from_db()
    assert rule.enabled is False and rule.name == "Slow tools"


def test_changed_conditions_forget_what_the_rule_matched(alice, traces, rule, queue):
    route_traces(rule=rule)
    url = f"/p/acme/triage/rules/{rule.pk}/"
    form = rule_form(queue, termination="timeout", sample_rate="1", name="Renamed")
    client = logged_in(alice)

    assert client.post(url, form).status_code == 302
    assert rule.matches.count() == 1  # a new name changes nothing it matched
    assert client.post(url, {**form, "min_tool_calls": "5"}).status_code == 302

    assert rule.matches.count() == 0
    assert queue.items.count() == 1  # what it queued stays queued


def test_run_now_hands_the_rule_to_the_worker(
    alice, rule, enqueued, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        response = logged_in(alice).post(
            f"/p/acme/triage/rules/{rule.pk}/run/", headers={"HX-Request": "true"}
        )

    assert response.status_code == 200
    assert enqueued.of(jobs.RUN_TRIAGE_RULE) == [(rule.pk,)]
    assert "Running “Timeouts”" in response.content.decode()


def test_clusters_page_groups_failing_traces(traces, victor, mallory):
    record_feedback(trace=traces["t-3"], text="Never guess a number.")

    response = logged_in(victor).get("/p/acme/triage/clusters/?clusters=2")

    page = response.content.decode()
    assert response.status_code == 200
    assert "2 failing traces" in page  # t-0 timed out, t-3 has feedback
    assert page.count('class="panel cluster"') == 2
    assert "Never guess a number." in page
    assert "t-1" not in page  # completed, no feedback: not a failure
    assert logged_in(mallory).get("/p/acme/triage/clusters/").status_code == 404
    assert logged_in(victor).get("/p/acme/triage/clusters/?clusters=x").status_code == 200


def test_clusters_page_says_when_older_failing_traces_were_left_out(traces, victor, monkeypatch):
    record_feedback(trace=traces["t-3"], text="Never guess a number.")
    monkeypatch.setattr(similarity, "MAX_CLUSTERED", 1)

    page = logged_in(victor).get("/p/acme/triage/clusters/").content.decode()

    assert "The newest 1 failing traces" in page
    assert "Older failing traces were left out" in page


def test_trace_page_loads_more_like_this(traces, victor):
    page = logged_in(victor).get(f"/p/acme/traces/{traces['t-0'].pk}/").content.decode()

    url = f"/p/acme/traces/{traces['t-0'].pk}/similar/"
    assert f'href="{url}" hx-get="{url}" hx-trigger="load"' in page


def test_more_like_this_reloads_when_the_review_changes(traces, victor):
    url = f"/p/acme/traces/{traces['t-0'].pk}/similar/"
    fragment = logged_in(victor).get(url, headers={"HX-Request": "true"}).content.decode()
    assert f'href="{url}" hx-get="{url}" hx-trigger="click, review-changed from:body"' in fragment


def test_more_like_this_ranks_the_nearest_first(traces, victor):
    response = logged_in(victor).get(
        f"/p/acme/traces/{traces['t-0'].pk}/similar/", headers={"HX-Request": "true"}
    )

    page = response.content.decode()
    assert response.status_code == 200
    assert page.lstrip().startswith('<section id="similar-traces">')
    assert page.index(">t-1<") < page.index(">t-2<") < page.index(">t-3<")
    assert 'type="checkbox"' not in page  # a viewer applies nothing


def test_more_like_this_is_not_shown_to_another_project(traces, mallory):
    client = logged_in(mallory)
    assert client.get(f"/p/acme/traces/{traces['t-0'].pk}/similar/").status_code == 404
    assert client.get(f"/p/globex/traces/{traces['t-0'].pk}/similar/").status_code == 404


def test_a_trace_without_a_vector_says_so(project, victor):
    ingest_traces(project=project, raw_items=[make_trace("bare")])
    trace = project.traces.get()

    response = logged_in(victor).get(f"/p/acme/traces/{trace.pk}/similar/")

    assert "not embedded yet" in response.content.decode()


def test_suggested_tags_offer_a_one_click_toggle(traces, bob, alice):
    slow = Tag.objects.create(project=traces["t-0"].project, name="slow")
    TraceTag.objects.create(trace=traces["t-1"], tag=slow, reviewer=alice)

    page = logged_in(bob).get(f"/p/acme/traces/{traces['t-0'].pk}/similar/").content.decode()

    toggle = f"/p/acme/traces/{traces['t-0'].pk}/tags/{slow.pk}/"
    assert f'hx-post="{toggle}" hx-target="#review-tags"' in page
    assert "+ slow" in page
    suggestions = page[page.index("Suggested tags") : page.index("More like this")]
    assert "1 of 1 similar reviewed trace</small>" in suggestions and "%" not in suggestions
    TraceTag.objects.create(trace=traces["t-0"], tag=slow, reviewer=bob)
    page = logged_in(bob).get(f"/p/acme/traces/{traces['t-0'].pk}/similar/").content.decode()
    assert "+ slow" not in page  # already on it


def test_a_reviewer_applies_feedback_to_the_traces_they_ticked(traces, bob):
    feedback, _ = record_feedback(trace=traces["t-0"], text="Retry once on a timeout.")
    url = f"/p/acme/traces/{traces['t-0'].pk}/similar/apply/"

    response = logged_in(bob).post(
        url,
        {"feedback": feedback.pk, "traces": [traces["t-1"].pk, traces["t-2"].pk]},
        headers={"HX-Request": "true"},
    )

    assert response.status_code == 200
    assert "Feedback copied to 2 traces" in response.content.decode()
    copies = Feedback.objects.exclude(pk=feedback.pk)
    assert {copy.trace.external_id for copy in copies} == {"t-1", "t-2"}
    assert all(copy.author == "bob" for copy in copies)
    assert CopiedFeedback.objects.filter(source=feedback).count() == 2
    assert not Feedback.objects.filter(trace=traces["t-3"]).exists()


def test_applying_feedback_needs_ticked_traces_and_this_traces_feedback(traces, bob):
    own, _ = record_feedback(trace=traces["t-0"], text="Retry once.")
    elsewhere, _ = record_feedback(trace=traces["t-3"], text="Not this one.")
    url = f"/p/acme/traces/{traces['t-0'].pk}/similar/apply/"
    client = logged_in(bob)

    nothing_ticked = client.post(url, {"feedback": own.pk}, headers={"HX-Request": "true"})
    wrong_feedback = client.post(url, {"feedback": elsewhere.pk, "traces": [traces["t-1"].pk]})

    assert nothing_ticked.status_code == 422
    assert "tick the traces it fits" in nothing_ticked.content.decode()
    assert wrong_feedback.status_code == 422
    assert Feedback.objects.count() == 2


def test_applying_feedback_is_forbidden_to_viewers_and_other_projects(traces, victor, mallory):
    feedback, _ = record_feedback(trace=traces["t-0"], text="Retry once.")
    form = {"feedback": feedback.pk, "traces": [traces["t-1"].pk]}
    url = f"/p/acme/traces/{traces['t-0'].pk}/similar/apply/"

    assert logged_in(victor).post(url, form).status_code == 403
    assert logged_in(mallory).post(url, form).status_code == 404
    assert logged_in(mallory).post(url.replace("acme", "globex"), form).status_code == 404
    assert Feedback.objects.count() == 1


def test_another_projects_trace_cannot_be_ticked(traces, bob, other_project):
    feedback, _ = record_feedback(trace=traces["t-0"], text="Retry once.")
    ingest_traces(project=other_project, raw_items=[make_trace("theirs")])
    theirs = other_project.traces.get()

    response = logged_in(bob).post(
        f"/p/acme/traces/{traces['t-0'].pk}/similar/apply/",
        {"feedback": feedback.pk, "traces": [theirs.pk]},
    )

    assert response.status_code == 422
    assert not Feedback.objects.filter(trace=theirs).exists()


def test_no_trace_or_rule_text_becomes_markup_on_the_triage_pages(project, alice, queue):
    from tests.e2e.test_xss import PAYLOADS, MarkupFromContent, payload_trace

    ingest_traces(
        project=project,
        raw_items=[payload_trace(index, payload) for index, payload in enumerate(PAYLOADS)],
    )
    stored = list(project.traces.order_by("id"))
    for index, (trace, payload) in enumerate(zip(stored, PAYLOADS, strict=True)):
        vector = np.zeros(similarity.DIMENSIONS, dtype=np.float32)
        vector[index % 3] = 1
        TraceEmbedding.objects.create(
            project=project,
            trace=trace,
            model_name=similarity.MODEL_NAME,
            vector=similarity.to_bytes(vector),
            content_hash="by hand",
        )
        record_feedback(trace=trace, text=payload)
        tag = Tag.objects.get(project=project, name=payload[:100])
        TraceTag.objects.create(trace=trace, tag=tag, reviewer=alice)
        TriageRule.objects.create(
            project=project, name=payload[:200], queue=queue, text=payload[:200]
        )
    client = logged_in(alice)
    pages = ["/p/acme/triage/", "/p/acme/triage/clusters/"] + [
        f"/p/acme/traces/{trace.pk}/similar/" for trace in stored[:5]
    ]
    for url in pages:
        response = client.get(url)
        assert response.status_code == 200, url
        parser = MarkupFromContent()
        parser.feed(response.content.decode().split("<main>", 1)[-1])  # the page, not the nav
        assert parser.problems == [], url
