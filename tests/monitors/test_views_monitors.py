"""The monitors page, the nav's alert count, the training-data page and GET /api/v1/alerts."""

from datetime import timedelta
from html.parser import HTMLParser

import pytest
from django.core.cache import cache
from django.test import Client
from django.utils import timezone

from reviewapp.monitors import alerts
from reviewapp.review.feedback import record_feedback
from reviewapp.traces.ingest import ingest_traces
from reviewapp.traces.models import Trace
from reviewapp.traces.rollups import roll_up_traces
from tests.e2e.test_xss import PAYLOADS, payload_trace
from tests.factories import ApiClient, make_trace
from tests.site.scenarios import SHORT_ANSWER, play


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _two_versions(project) -> None:
    """agent-1: 20 completed traces; agent-2: 20 traces, 8 of them timed out."""
    ingest_traces(
        project=project,
        raw_items=[make_trace(f"one-{i}", model="agent-1") for i in range(20)],
    )
    ingest_traces(
        project=project,
        raw_items=[
            make_trace(f"two-{i}", model="agent-2", termination="timeout" if i < 8 else "completed")
            for i in range(20)
        ],
    )


@pytest.fixture(autouse=True)
def _fresh_cache():
    cache.clear()


def test_the_page_shows_each_version_with_numbers_that_link_to_their_traces(victor, project):
    _two_versions(project)
    html = logged_in(victor).get("/p/acme/monitors/").content.decode()
    assert "agent-1 (base)" in html and "agent-2 (base)" in html
    assert (
        '<a href="/p/acme/traces/?adapter=base&amp;model=agent-2&amp;termination=timeout">40.0%</a>'
        in html
    )
    assert html.count("<svg") == 8  # seven metrics over time and the terminations
    assert "timeouts_rising" in html and "40% of traces timed out (8 of 20)" in html


def test_feedback_on_a_trace_changed_behind_the_rollups_does_not_break_the_page(victor, project):
    _two_versions(project)
    trace = project.traces.first()
    Trace.objects.filter(pk=trace.pk).update(adapter_version="edited-by-hand")  # no writer
    record_feedback(trace=trace, text="Wrong order.", reviewer=victor)

    response = logged_in(victor).get("/p/acme/monitors/")

    assert response.status_code == 200
    assert "agent-1 (base)" in response.content.decode()


def test_an_evidence_link_lists_exactly_the_traces_behind_the_number(victor, project):
    _two_versions(project)
    html = (
        logged_in(victor)
        .get("/p/acme/traces/?adapter=base&model=agent-2&termination=timeout")
        .content.decode()
    )
    assert html.count('class="termination-timeout"') == 8
    assert "one-" not in html


def test_filters_narrow_the_monitors_and_htmx_gets_the_fragment(victor, project):
    _two_versions(project)
    client = logged_in(victor)
    html = client.get("/p/acme/monitors/", {"model": "agent-1"}).content.decode()
    assert "agent-1 (base)" in html and "agent-2 (base)" not in html
    response = client.get(
        "/p/acme/monitors/", {"bucket": "hour", "model": "agent-2"}, headers={"HX-Request": "true"}
    )
    fragment = response.content.decode()
    assert response.status_code == 200
    assert fragment.lstrip().startswith('<div id="monitor-results">')
    # Per hour covers two weeks unless told otherwise, and its links say so.
    since = (timezone.localdate() - timedelta(days=13)).isoformat()
    assert f"Over time (hour, since {since})" in fragment
    # Evidence links keep the page's filters.
    assert f"/p/acme/traces/?model=agent-2&amp;since={since}&amp;adapter=base" in fragment


def test_a_bad_filter_is_422_not_500(victor, project):
    response = logged_in(victor).get("/p/acme/monitors/", {"since": "yesterday", "bucket": "week"})
    assert response.status_code == 422
    assert "Enter a valid date" in response.content.decode()


def test_the_seed_scenario_shows_its_alert_on_the_page(bob, project, api_key):
    play(project=project, api_key=api_key, adapter_version="acme-v1", episodes=20, seed=1)
    play(
        project=project, api_key=api_key, adapter_version="acme-v2", episodes=20,
        answer=SHORT_ANSWER, tool_failure_rate=0.3, seed=2,
    )  # fmt: skip
    html = logged_in(bob).get("/p/acme/monitors/").content.decode()
    assert "shrinking_under_tool_errors" in html
    assert "acme-v1 → acme-v2" in html
    assert "<code>calculator</code>" in html or "<code>lookup</code>" in html


def test_the_nav_shows_the_alert_count(victor, project):
    client = logged_in(victor)
    nav = {"HX-Request": "true", "HX-Target": "nav-monitors"}
    assert "badge" not in client.get("/p/acme/monitors/", headers=nav).content.decode()
    _two_versions(project)
    cache.clear()
    html = client.get("/p/acme/monitors/", headers=nav).content.decode()
    assert html.strip().startswith("Monitors")
    assert 'class="badge alert"' in html and ">1<" in html
    page = client.get("/p/acme/traces/").content.decode()
    monitors = 'href="/p/acme/monitors/" hx-get="/p/acme/monitors/" hx-trigger="load"'
    assert f'<a id="nav-monitors" {monitors}' in page


@pytest.mark.parametrize(
    ("path", "headers"),
    [
        ("monitors/", {}),
        ("monitors/", {"HX-Request": "true", "HX-Target": "nav-monitors"}),
        ("dataset/", {}),
    ],
)
def test_other_projects_members_get_404_and_strangers_the_login(mallory, project, path, headers):
    assert logged_in(mallory).get(f"/p/acme/{path}", headers=headers).status_code == 404
    response = Client().get(f"/p/acme/{path}", headers=headers)
    assert response.status_code == 302 and response["Location"].startswith("/login/")


def test_the_dataset_page_counts_what_is_left_out(victor, project):
    ingest_traces(project=project, raw_items=[make_trace("t-1")])
    record_feedback(trace=project.traces.get(), text="No target yet.", turn=4)
    html = logged_in(victor).get("/p/acme/dataset/").content.decode()
    assert '<strong id="included-count">0</strong> of 1 candidates' in html
    assert "feedback without targets yet" in html
    # A viewer reads the policy; only admins get the form.
    assert "Timed-out traces: keep" in html and 'action="/p/acme/dataset/"' not in html


def test_the_left_out_labels_follow_the_policy_in_force(victor, project):
    client = logged_in(victor)
    html = client.get("/p/acme/dataset/").content.decode()
    assert "(data policy: exclude)" not in html
    assert "trace timed out (data policy: keep, none left out)" in html
    project.settings = {"data_policy": {"timeout": "exclude"}}
    project.save()
    html = client.get("/p/acme/dataset/").content.decode()
    assert "trace timed out (data policy: exclude)" in html
    assert "trace ended in a tool error (data policy: keep, none left out)" in html


def test_an_admin_changes_the_data_policy(alice, project):
    response = logged_in(alice).post(
        "/p/acme/dataset/", {"timeout": "exclude", "tool_error": "keep", "failing_checks": "keep"}
    )
    assert response.status_code == 302
    project.refresh_from_db()
    assert project.settings["data_policy"] == {
        "timeout": "exclude", "tool_error": "keep", "failing_checks": "keep"
    }  # fmt: skip


def test_a_bad_policy_is_422_and_changes_nothing(alice, project):
    response = logged_in(alice).post(
        "/p/acme/dataset/", {"timeout": "drop", "tool_error": "keep", "failing_checks": "keep"}
    )
    assert response.status_code == 422
    assert "Select a valid choice" in response.content.decode()
    project.refresh_from_db()
    assert "data_policy" not in project.settings


@pytest.mark.parametrize("user", ["bob", "victor"])
def test_only_admins_change_the_policy(request, project, user):
    member = request.getfixturevalue(user)
    response = logged_in(member).post(
        "/p/acme/dataset/", {"timeout": "exclude", "tool_error": "keep", "failing_checks": "keep"}
    )
    assert response.status_code == 403
    project.refresh_from_db()
    assert "data_policy" not in project.settings


def test_the_retrain_page_shows_the_policy_and_the_exclusions(alice, project):
    project.settings = {"data_policy": {"timeout": "exclude"}}
    project.save()
    html = logged_in(alice).get("/p/acme/retrain/").content.decode()
    assert "timed-out traces <strong>exclude</strong>" in html
    assert "<strong>0</strong> of 0 candidates go into the run." in html


def test_api_alerts_need_a_key(project):
    response = ApiClient(None).get("/api/v1/alerts")
    assert response.status_code == 401
    assert "error" in response.json()


def test_api_alerts_list_only_the_keys_projects_alerts(admin_api, other_admin_api, project):
    _two_versions(project)
    [alert] = admin_api.get("/api/v1/alerts").json()["alerts"]
    assert (alert["kind"], alert["severity"]) == ("timeouts_rising", "critical")
    assert (alert["version"], alert["previous_version"]) == ("agent-2 (base)", "agent-1 (base)")
    assert alert["evidence"][0]["url"].startswith("http://testserver/p/acme/traces/?")
    assert other_admin_api.get("/api/v1/alerts").json() == {"alerts": []}


class _Markup(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def test_trace_text_in_versions_tools_and_alerts_stays_text(victor, project, monkeypatch):
    monkeypatch.setattr(alerts, "MIN_TRACES", 1)
    for index, payload in enumerate(PAYLOADS):
        item = payload_trace(index, payload)
        item.update(tags=[], termination="timeout" if index % 2 else "completed")
        ingest_traces(project=project, raw_items=[item])
        Trace.objects.filter(project=project, model=item["model"]).update(adapter_version=payload)
        roll_up_traces(trace_ids=project.traces.values_list("id", flat=True))  # as writers do
    client = logged_in(victor)
    pages = ["/p/acme/monitors/", "/p/acme/monitors/?bucket=hour", "/p/acme/dataset/"]
    for path in pages:
        html = client.get(path).content.decode()
        assert "timeouts_rising" in html or path.endswith("dataset/")
        parser = _Markup()
        parser.feed(html[html.index("<body") :])  # the head's scripts are the page's own
        for tag, attrs in parser.tags:
            assert tag not in {"script", "iframe", "img", "object", "embed", "math", "style"}, tag
            assert tag != "svg" or attrs.get("class", "").startswith("chart"), attrs
            for name, value in attrs.items():
                assert not name.startswith(("on", "hx-on")), (tag, name)
                if name in ("hx-get", "hx-post", "href", "action"):
                    assert value.startswith(("/", "?", "#", "data:,")), (tag, name, value)
