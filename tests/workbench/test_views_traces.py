import json

import pytest
from django.test import Client

from reviewapp.review.models import Feedback
from reviewapp.traces.ingest import ingest_traces
from reviewapp.traces.models import Tag, TraceTag
from tests.factories import make_trace


@pytest.fixture
def traces(project):
    items = [make_trace(f"t-{i}") for i in range(3)]
    items[1]["termination"] = "timeout"
    items[1]["messages"][1]["content"] = "Book a flight to Oslo"
    ingest_traces(project=project, raw_items=items)
    return {trace.external_id: trace for trace in project.traces.all()}


@pytest.fixture
def slow_tag(project):
    return Tag.objects.create(project=project, name="slow")


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def list_url(slug="acme", **params):
    from urllib.parse import urlencode

    return f"/p/{slug}/traces/" + (f"?{urlencode(params, doseq=True)}" if params else "")


def detail_url(trace, slug="acme"):
    return f"/p/{slug}/traces/{trace.pk}/"


def test_it_asks_anonymous_people_to_log_in(traces):
    response = Client().get(list_url())
    assert response.status_code == 302
    assert response["Location"].startswith("/login/")


def test_it_lists_the_projects_traces_newest_first(bob, traces):
    response = logged_in(bob).get(list_url())
    assert response.status_code == 200
    html = response.content.decode()
    assert html.index("t-2") < html.index("t-1") < html.index("t-0")


def test_it_filters_by_termination_and_text_and_keeps_filters_in_the_url(bob, traces):
    client = logged_in(bob)
    html = client.get(list_url(termination="timeout")).content.decode()
    assert "t-1" in html and "t-0" not in html
    html = client.get(list_url(q="oslo")).content.decode()
    assert "t-1" in html and "t-2" not in html


def test_it_filters_by_tag_and_feedback(bob, traces, slow_tag):
    TraceTag.objects.create(trace=traces["t-0"], tag=slow_tag, reviewer=bob)
    Feedback.objects.create(trace=traces["t-2"], text="x", content_hash="h")
    client = logged_in(bob)
    html = client.get(list_url(tag="slow")).content.decode()
    assert "t-0" in html and "t-1" not in html
    html = client.get(list_url(feedback="yes")).content.decode()
    assert "t-2" in html and "t-0" not in html
    html = client.get(list_url(review="unreviewed")).content.decode()
    assert "t-1" in html and "t-0" not in html and "t-2" not in html


def test_htmx_filter_requests_get_only_the_results_fragment(bob, traces):
    response = logged_in(bob).get(
        list_url(q="oslo"), headers={"HX-Request": "true", "HX-Target": "trace-results"}
    )
    html = response.content.decode()
    assert 'id="trace-results"' in html
    assert "<html" not in html


def test_the_list_pages_with_a_cursor(bob, project):
    ingest_traces(project=project, raw_items=[make_trace(f"p-{i:03d}") for i in range(60)])
    client = logged_in(bob)
    first = client.get(list_url()).content.decode()
    assert "p-059" in first and "p-009" not in first
    cursor = first.split("cursor=")[1].split('"')[0]
    second = client.get(f"{list_url()}?cursor={cursor}").content.decode()
    assert "p-009" in second and "p-059" not in second


def test_another_projects_list_and_traces_are_404(mallory, traces):
    client = logged_in(mallory)
    assert client.get(list_url()).status_code == 404
    assert client.get(detail_url(traces["t-0"])).status_code == 404


def test_a_trace_of_another_project_is_404_even_with_my_project_in_the_url(mallory, traces):
    assert logged_in(mallory).get(detail_url(traces["t-0"], slug="globex")).status_code == 404


def test_the_detail_page_shows_the_conversation_with_tool_results(bob, traces):
    html = logged_in(bob).get(detail_url(traces["t-0"])).content.decode()
    assert "What is 12 * 7?" in html
    assert "calculator" in html
    assert "&quot;expression&quot;: &quot;12*7&quot;" in html  # arguments pretty-printed
    assert "84" in html
    assert "called" in html


def test_tool_errors_are_highlighted(bob, project):
    trace = make_trace("err")
    trace["messages"][3]["content"] = "Error: upstream timed out"
    ingest_traces(project=project, raw_items=[trace])
    html = logged_in(bob).get(detail_url(project.traces.get())).content.decode()
    assert "tool-error" in html


def test_a_long_trace_renders_its_first_messages_then_loads_the_rest(bob, project):
    messages = [{"role": "user", "content": f"message number {i}"} for i in range(450)]
    ingest_traces(project=project, raw_items=[make_trace("long", messages=messages, tools=[])])
    trace = project.traces.get()
    client = logged_in(bob)
    html = client.get(detail_url(trace)).content.decode()
    assert "message number 199<" in html and "message number 200<" not in html
    assert "?start=200" in html
    more = client.get(detail_url(trace) + "?start=200", headers={"HX-Request": "true"})
    assert "message number 200<" in more.content.decode()
    assert "<html" not in more.content.decode()


def test_a_reviewer_toggles_a_tag_with_htmx(bob, traces, slow_tag):
    client = logged_in(bob)
    url = f"{detail_url(traces['t-0'])}tags/{slow_tag.pk}/"
    response = client.post(url, headers={"HX-Request": "true"})
    assert response.status_code == 200
    assert 'aria-pressed="true"' in response.content.decode()
    assert TraceTag.objects.filter(trace=traces["t-0"], tag=slow_tag, reviewer=bob).exists()
    client.post(url, headers={"HX-Request": "true"})
    assert not TraceTag.objects.filter(trace=traces["t-0"], reviewer=bob).exists()


def test_a_viewer_cannot_tag_or_write_feedback(victor, traces, slow_tag):
    client = logged_in(victor)
    assert client.post(f"{detail_url(traces['t-0'])}tags/{slow_tag.pk}/").status_code == 403
    response = client.post(
        f"{detail_url(traces['t-0'])}feedback/", {"anchor": "trace", "text": "x"}
    )
    assert response.status_code == 403
    assert not Feedback.objects.exists()


def test_a_tag_of_another_project_cannot_be_put_on_a_trace(bob, traces, other_project):
    foreign = Tag.objects.create(project=other_project, name="foreign")
    response = logged_in(bob).post(f"{detail_url(traces['t-0'])}tags/{foreign.pk}/")
    assert response.status_code == 404
    assert not TraceTag.objects.exists()


def test_feedback_pinned_to_a_tool_call_from_the_page(bob, traces):
    response = logged_in(bob).post(
        f"{detail_url(traces['t-0'])}feedback/",
        {"anchor": "call:call_1", "text": "Pass integers only.", "check_calls_tool": "calculator"},
        headers={"HX-Request": "true"},
    )
    assert response.status_code == 200
    feedback = Feedback.objects.get()
    assert (feedback.turn, feedback.tool_call_id, feedback.reviewer) == (2, "call_1", bob)
    assert feedback.checks == [{"kind": "calls_tool", "value": "calculator"}]
    assert "Pass integers only." in response.content.decode()


def test_saved_feedback_tells_the_page_to_reload_more_like_this(bob, traces):
    response = logged_in(bob).post(
        f"{detail_url(traces['t-0'])}feedback/",
        {"anchor": "trace", "text": "Retry once."},
        headers={"HX-Request": "true"},
    )
    assert json.loads(response["HX-Trigger"]) == {"review-changed": {}}


def test_a_corrected_tool_call_that_breaks_the_schema_rerenders_the_form_with_422(bob, traces):
    response = logged_in(bob).post(
        f"{detail_url(traces['t-0'])}feedback/",
        {
            "anchor": "turn:2",
            "text": "wrong argument",
            "correction_tool": "calculator",
            "correction_arguments": '{"expr": 1}',
        },
        headers={"HX-Request": "true"},
    )
    assert response.status_code == 422
    assert "is a required property" in response.content.decode()
    assert not Feedback.objects.exists()


def test_feedback_without_htmx_redirects_back(bob, traces):
    response = logged_in(bob).post(
        f"{detail_url(traces['t-0'])}feedback/", {"anchor": "turn:4", "text": "Good."}
    )
    assert response.status_code == 302
    assert Feedback.objects.get().turn == 4


def test_only_the_author_deletes_feedback(alice, bob, traces):
    logged_in(bob).post(f"{detail_url(traces['t-0'])}feedback/", {"anchor": "trace", "text": "x"})
    feedback = Feedback.objects.get()
    url = f"{detail_url(traces['t-0'])}feedback/{feedback.pk}/delete/"
    logged_in(alice).post(url)
    assert Feedback.objects.exists()
    logged_in(bob).post(url)
    assert not Feedback.objects.exists()


def test_writes_need_a_csrf_token(bob, traces, slow_tag):
    client = Client(enforce_csrf_checks=True)
    client.force_login(bob)
    response = client.post(f"{detail_url(traces['t-0'])}tags/{slow_tag.pk}/")
    assert response.status_code == 403
    assert not TraceTag.objects.exists()


def test_pages_carry_an_enforced_content_security_policy(bob, traces):
    response = logged_in(bob).get(detail_url(traces["t-0"]))
    policy = response["Content-Security-Policy"]
    assert "script-src 'self'" in policy
    assert "unsafe-inline" not in policy
    assert "Content-Security-Policy-Report-Only" not in response


def test_about_lists_only_the_assistant_replies_and_tool_calls_of_a_long_trace(bob, project):
    messages = [{"role": "system", "content": "Be brief."}]
    for step in range(30):
        messages += [
            {"role": "user", "content": f"question {step}"},
            {"role": "assistant", "content": f"answer {step} is here"},
        ]
    ingest_traces(project=project, raw_items=[make_trace("long", messages=messages, tools=[])])
    html = logged_in(bob).get(detail_url(project.traces.get())).content.decode()
    about = html[html.index('name="anchor"') : html.index("</select>", html.index('name="anchor"'))]
    assert about.count("<option") == 31  # the whole trace, and the 30 replies
    assert 'value="turn:2">#2 answer 0 is here</option>' in about
    assert "question" not in about and 'value="turn:1"' not in about
