"""Review queues: building, reserving, the done-next flow, blind mode, agreement."""

import threading
from datetime import timedelta
from urllib.parse import urlencode

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.utils import timezone

from reviewapp.projects.models import Membership
from reviewapp.review import queues as queue_service
from reviewapp.review.models import Feedback, Queue, QueueItem, QueueReview, ReviewStatus
from reviewapp.review.queues import (
    QueueError,
    build_queue,
    finish_item,
    reserve_next_item,
)
from reviewapp.traces.ingest import ingest_traces
from reviewapp.traces.models import Tag, TraceTag
from tests.factories import make_trace


@pytest.fixture
def carol(project):
    """Another reviewer of the acme project."""
    user = get_user_model().objects.create_user("carol", password="correct horse battery")
    Membership.objects.create(project=project, user=user, role="reviewer")
    return user


@pytest.fixture
def traces(project):
    """Four traces, t-0 to t-3; t-1 and t-3 timed out."""
    items = [make_trace(f"t-{i}") for i in range(4)]
    for timed_out in (1, 3):
        items[timed_out]["termination"] = "timeout"
    ingest_traces(project=project, raw_items=items)
    return {trace.external_id: trace for trace in project.traces.all()}


@pytest.fixture
def slow(project):
    return Tag.objects.create(project=project, name="slow")


@pytest.fixture
def rude(project):
    return Tag.objects.create(project=project, name="rude")


def make_queue(project, *, reviewers_per_item=1, blind=False, assignees=(), **filters) -> Queue:
    """A queue over the matching traces, oldest first (t-0 is item 1)."""
    return build_queue(
        project=project,
        name="Weekly review",
        filters={"sort": "oldest", **filters},
        filter_query="",
        sample_size=None,
        seed=None,
        reviewers_per_item=reviewers_per_item,
        blind=blind,
        assignees=list(assignees),
        created_by=None,
    )


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def queue_url(queue, suffix="", slug="acme") -> str:
    return f"/p/{slug}/queues/{queue.pk}/{suffix}"


def done_url(queue, item, slug="acme") -> str:
    return queue_url(queue, f"items/{item.pk}/done/", slug)


def item_page(item) -> str:
    return f"/p/acme/traces/{item.trace_id}/?queue={item.queue_id}&item={item.pk}"


def external_id(item) -> str:
    return item.trace.external_id


# Building


def test_it_prefills_the_create_form_from_the_trace_list_query(alice, traces):
    query = urlencode({"termination": "timeout", "q": "12", "sort": "oldest"})
    response = logged_in(alice).get(f"/p/acme/queues/new/?{query}")
    assert response.status_code == 200
    html = response.content.decode()
    assert 'value="timeout" id="id_termination_2" checked>' in html
    assert 'name="q" value="12"' in html
    assert "2 match" in html


def test_it_builds_a_queue_from_the_filters_and_opens_it(alice, carol, traces):
    response = logged_in(alice).post(
        "/p/acme/queues/new/",
        {
            "name": "Timeouts",
            "termination": "timeout",
            "sort": "oldest",
            "reviewers_per_item": "1",
            "assignees": [carol.pk],
        },
    )
    queue = Queue.objects.get()
    assert response.status_code == 302
    assert response["Location"] == queue_url(queue)
    assert [external_id(item) for item in queue.items.order_by("position")] == ["t-1", "t-3"]
    assert queue.filter_query == "termination=timeout&sort=oldest"
    assert list(queue.assignees.all()) == [carol]
    assert queue.created_by == alice


def test_a_sample_is_random_but_reproducible_with_a_seed(project, traces):
    def sampled(seed):
        queue = build_queue(
            project=project,
            name="sample",
            filters={},
            filter_query="",
            sample_size=2,
            seed=seed,
            reviewers_per_item=1,
            blind=False,
            assignees=[],
            created_by=None,
        )
        return [item.trace_id for item in queue.items.order_by("position")]

    first = sampled(7)
    assert len(first) == 2
    assert sampled(7) == first
    assert {tuple(sampled(seed)) for seed in range(20)} != {tuple(first)}


def test_it_refuses_a_queue_over_the_cap(alice, traces, monkeypatch):
    monkeypatch.setattr(queue_service, "MAX_QUEUE_ITEMS", 3)
    response = logged_in(alice).post(
        "/p/acme/queues/new/", {"name": "All", "reviewers_per_item": "1"}
    )
    assert response.status_code == 422
    assert "more than 3 traces match" in response.content.decode()
    assert not Queue.objects.exists()


def test_it_refuses_more_reviewers_per_item_than_assignees(alice, carol, traces):
    response = logged_in(alice).post(
        "/p/acme/queues/new/", {"name": "x", "reviewers_per_item": "2", "assignees": [carol.pk]}
    )
    assert response.status_code == 422
    assert "only 1 assigned" in response.content.decode()


def test_a_filter_matching_nothing_builds_no_queue(project, traces):
    with pytest.raises(QueueError, match="no traces match"):
        make_queue(project, q="nothing like this")


def test_a_viewer_cannot_create_a_queue(victor, traces):
    client = logged_in(victor)
    assert client.get("/p/acme/queues/new/").status_code == 403
    response = client.post("/p/acme/queues/new/", {"name": "x", "reviewers_per_item": "1"})
    assert response.status_code == 403
    assert not Queue.objects.exists()


def test_a_reviewer_cannot_create_a_queue(bob, traces):
    client = logged_in(bob)
    assert client.get("/p/acme/queues/new/").status_code == 403
    response = client.post("/p/acme/queues/new/", {"name": "x", "reviewers_per_item": "1"})
    assert response.status_code == 403
    assert not Queue.objects.exists()


def test_the_new_queue_button_shows_to_admins_only(alice, bob, traces):
    assert "/p/acme/queues/new/" in logged_in(alice).get("/p/acme/queues/").content.decode()
    assert "/p/acme/queues/new/" not in logged_in(bob).get("/p/acme/queues/").content.decode()


# Looking at queues


def test_it_lists_queues_with_their_progress(victor, bob, project, traces):
    queue = make_queue(project, termination=["timeout"])
    finish_item(item=reserve_next_item(queue=queue, reviewer=bob), reviewer=bob)
    html = logged_in(victor).get("/p/acme/queues/").content.decode()
    assert "Weekly review" in html
    assert '<progress value="1" max="2">' in html


def test_the_queue_page_shows_progress_per_reviewer(alice, bob, project, traces):
    queue = make_queue(project, reviewers_per_item=2, assignees=[alice, bob])
    finish_item(item=reserve_next_item(queue=queue, reviewer=bob), reviewer=bob)
    response = logged_in(alice).get(queue_url(queue))
    html = response.content.decode()
    assert response.status_code == 200
    assert "0 of 4 items fully reviewed" in html
    assert "<td>bob</td><td>1</td>" in html
    assert "<td>alice</td><td>0</td>" in html
    assert queue_url(queue, "next/") in html
    assert queue_url(queue, "agreement/") in html


def test_the_progress_fragment_refreshes_over_htmx(bob, project, traces):
    queue = make_queue(project)
    response = logged_in(bob).get(queue_url(queue), headers={"HX-Request": "true"})
    html = response.content.decode()
    assert 'id="queue-progress"' in html
    assert "<html" not in html


def test_another_projects_queue_is_404(mallory, bob, project, other_project, traces):
    queue = make_queue(project)
    client = logged_in(mallory)
    for suffix in ("", "agreement/"):
        assert client.get(queue_url(queue, suffix)).status_code == 404
        assert client.get(queue_url(queue, suffix, slug="globex")).status_code == 404
    assert client.post(queue_url(queue, "next/")).status_code == 404
    assert client.post(queue_url(queue, "next/", slug="globex")).status_code == 404
    item = queue.items.first()
    assert client.post(done_url(queue, item, slug="globex")).status_code == 404
    assert logged_in(bob).get("/p/globex/queues/").status_code == 404


# Working a queue


def test_start_reviewing_reserves_an_item_and_opens_its_trace(bob, project, traces):
    queue = make_queue(project)
    response = logged_in(bob).post(queue_url(queue, "next/"))
    item = QueueItem.objects.get(queue=queue, position=1)
    assert response.status_code == 302
    assert response["Location"] == item_page(item)
    review = QueueReview.objects.get(item=item)
    assert (review.reviewer, review.status) == (bob, ReviewStatus.RESERVED)


def test_a_get_of_next_reserves_nothing(bob, project, traces):
    queue = make_queue(project)

    response = logged_in(bob).get(queue_url(queue, "next/"))

    assert response.status_code == 405
    assert not QueueReview.objects.exists()


def test_the_queue_page_starts_reviewing_with_a_post_form(bob, project, traces):
    queue = make_queue(project)

    html = logged_in(bob).get(queue_url(queue)).content.decode()

    assert f'<form method="post" action="{queue_url(queue, "next/")}">' in html


def test_the_last_item_done_over_htmx_goes_back_to_the_queue_page(bob, project, traces):
    queue = make_queue(project, termination=["timeout"])
    client = logged_in(bob)
    finish_item(item=reserve_next_item(queue=queue, reviewer=bob), reviewer=bob)
    last = reserve_next_item(queue=queue, reviewer=bob)

    response = client.post(done_url(queue, last), headers={"HX-Request": "true"})

    assert response["HX-Redirect"] == queue_url(queue)


def test_the_trace_page_opened_from_a_queue_has_the_done_next_form(bob, project, traces):
    queue = make_queue(project)
    client = logged_in(bob)
    client.post(queue_url(queue, "next/"))
    item = queue.items.get(position=1)
    html = client.get(item_page(item)).content.decode()
    assert 'id="done-next"' in html
    assert f'action="{done_url(queue, item)}"' in html
    assert "item 1 of 4" in html


def test_the_trace_page_ignores_a_queue_item_the_user_does_not_hold(bob, carol, project, traces):
    queue = make_queue(project)
    logged_in(carol).post(queue_url(queue, "next/"))
    item = queue.items.get(position=1)
    response = logged_in(bob).get(item_page(item))
    assert response.status_code == 200
    assert 'id="done-next"' not in response.content.decode()


def test_done_next_finishes_the_item_and_goes_to_the_next(bob, project, traces):
    queue = make_queue(project)
    client = logged_in(bob)
    client.post(queue_url(queue, "next/"))
    first, second = queue.items.order_by("position")[:2]
    response = client.post(done_url(queue, first))
    assert response.status_code == 302
    assert response["Location"] == item_page(second)
    assert QueueReview.objects.get(item=first).status == ReviewStatus.DONE


def test_done_next_over_htmx_redirects_the_whole_page(bob, project, traces):
    queue = make_queue(project)
    client = logged_in(bob)
    client.post(queue_url(queue, "next/"))
    response = client.post(
        done_url(queue, queue.items.get(position=1)), headers={"HX-Request": "true"}
    )
    assert response["HX-Redirect"] == item_page(queue.items.get(position=2))


def test_done_twice_is_harmless(bob, project, traces):
    queue = make_queue(project)
    item = reserve_next_item(queue=queue, reviewer=bob)
    first = finish_item(item=item, reviewer=bob)
    again = finish_item(item=item, reviewer=bob)
    assert again.done_at == first.done_at


def test_done_needs_a_reservation(bob, project, traces):
    queue = make_queue(project)
    response = logged_in(bob).post(done_url(queue, queue.items.get(position=2)))
    assert response.status_code == 409
    assert not QueueReview.objects.exists()


def test_skip_moves_on_and_frees_the_place_for_someone_else(bob, carol, project, traces):
    queue = make_queue(project)
    client = logged_in(bob)
    client.post(queue_url(queue, "next/"))
    first = queue.items.get(position=1)
    client.post(done_url(queue, first), {"action": "skip"})
    assert QueueReview.objects.get(item=first, reviewer=bob).status == ReviewStatus.SKIPPED
    assert reserve_next_item(queue=queue, reviewer=bob).position == 2
    assert reserve_next_item(queue=queue, reviewer=carol) == first


def test_a_viewer_cannot_work_a_queue(victor, bob, project, traces):
    queue = make_queue(project)
    item = reserve_next_item(queue=queue, reviewer=bob)
    client = logged_in(victor)
    assert client.post(queue_url(queue, "next/")).status_code == 403
    assert client.post(done_url(queue, item)).status_code == 403
    assert QueueReview.objects.get(item=item).status == ReviewStatus.RESERVED


def test_a_reviewer_not_assigned_to_the_queue_is_refused(bob, carol, project, traces):
    queue = make_queue(project, assignees=[carol])
    item = reserve_next_item(queue=queue, reviewer=carol)
    client = logged_in(bob)
    assert client.post(queue_url(queue, "next/")).status_code == 403
    assert client.post(done_url(queue, item)).status_code == 403
    assert logged_in(carol).post(queue_url(queue, "next/")).status_code == 302


def test_anonymous_people_are_asked_to_log_in(project, traces):
    queue = make_queue(project)
    response = Client().get(queue_url(queue))
    assert response.status_code == 302
    assert response["Location"].startswith("/login/")


def test_next_shows_done_when_nothing_is_left(bob, project, traces):
    queue = make_queue(project, termination=["timeout"])
    client = logged_in(bob)
    for _ in range(2):
        item = reserve_next_item(queue=queue, reviewer=bob)
        finish_item(item=item, reviewer=bob)
    response = client.post(queue_url(queue, "next/"))
    assert response.status_code == 200
    html = response.content.decode()
    assert 'id="queue-done"' in html
    assert "2 of 2 items fully reviewed" in html


# Reservation semantics


def test_one_reviewer_per_item_gives_two_reviewers_different_items(alice, bob, project, traces):
    queue = make_queue(project)
    assert reserve_next_item(queue=queue, reviewer=alice).position == 1
    assert reserve_next_item(queue=queue, reviewer=bob).position == 2


def test_two_reviewers_per_item_gives_both_the_same_item(alice, bob, carol, project, traces):
    queue = make_queue(project, reviewers_per_item=2)
    assert reserve_next_item(queue=queue, reviewer=alice).position == 1
    assert reserve_next_item(queue=queue, reviewer=bob).position == 1
    assert reserve_next_item(queue=queue, reviewer=carol).position == 2


def test_a_reviewer_gets_their_own_reservation_back(alice, project, traces):
    queue = make_queue(project)
    first = reserve_next_item(queue=queue, reviewer=alice)
    assert reserve_next_item(queue=queue, reviewer=alice) == first
    assert QueueReview.objects.count() == 1


def test_an_expired_reservation_is_reclaimed(alice, bob, project, traces):
    queue = make_queue(project)
    now = timezone.now()
    first = reserve_next_item(queue=queue, reviewer=alice, now=now)
    later = now + queue_service.RESERVATION + timedelta(seconds=1)
    assert reserve_next_item(queue=queue, reviewer=bob, now=later) == first
    assert reserve_next_item(queue=queue, reviewer=alice, now=later).position == 2


def test_a_reviewer_whose_reservation_lapsed_can_still_take_the_item(alice, bob, project, traces):
    queue = make_queue(project, reviewers_per_item=2)
    now = timezone.now()
    first = reserve_next_item(queue=queue, reviewer=alice, now=now)
    finish_item(item=reserve_next_item(queue=queue, reviewer=bob, now=now), reviewer=bob)
    later = now + queue_service.RESERVATION + timedelta(seconds=1)
    assert reserve_next_item(queue=queue, reviewer=alice, now=later) == first


def test_a_done_item_is_not_served_again(alice, bob, project, traces):
    queue = make_queue(project, termination=["timeout"])
    first = reserve_next_item(queue=queue, reviewer=alice)
    finish_item(item=first, reviewer=alice)
    assert reserve_next_item(queue=queue, reviewer=alice).position == 2
    assert reserve_next_item(queue=queue, reviewer=bob) is None  # item 1 done, item 2 held


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("reviewers_per_item", "items"), [(1, 5), (2, 3)])
def test_concurrent_reviewers_never_over_reserve_an_item(project, reviewers_per_item, items):
    ingest_traces(project=project, raw_items=[make_trace(f"c-{i}") for i in range(items)])
    queue = make_queue(project, reviewers_per_item=reviewers_per_item)
    people = [get_user_model().objects.create_user(f"reviewer-{i}", password="x") for i in range(8)]
    start = threading.Barrier(len(people))
    claimed, errors = {}, []

    def work(person):
        try:
            start.wait()
            item = reserve_next_item(queue=queue, reviewer=person)
            claimed[person.username] = item.pk if item else None
        except Exception as error:  # surfaced by the assertion below
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=work, args=(person,)) for person in people]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    per_item = [
        QueueReview.objects.filter(item=item, status=ReviewStatus.RESERVED).count()
        for item in queue.items.all()
    ]
    assert max(per_item) <= reviewers_per_item
    served = [item_id for item_id in claimed.values() if item_id is not None]
    assert len(served) == min(len(people), items * reviewers_per_item)
    assert sum(per_item) == len(served)


# Blind mode


def test_blind_mode_hides_others_work_until_the_reviewer_is_done(alice, bob, project, traces, slow):
    queue = make_queue(project, reviewers_per_item=2, blind=True)
    bob_item = reserve_next_item(queue=queue, reviewer=bob)
    TraceTag.objects.create(trace=bob_item.trace, tag=slow, reviewer=bob)
    Feedback.objects.create(
        trace=bob_item.trace,
        reviewer=bob,
        author="bob",
        text="Bob thinks it dawdles",
        content_hash="b",
    )
    finish_item(item=bob_item, reviewer=bob)
    item = reserve_next_item(queue=queue, reviewer=alice)
    assert item == bob_item
    client = logged_in(alice)

    html = client.get(item_page(item)).content.decode()
    assert "Bob thinks it dawdles" not in html
    assert "<small>bob</small>" not in html

    # Toggling her own tag re-renders the tags fragment: still blind.
    toggled = client.post(
        f"/p/acme/traces/{item.trace_id}/tags/{slow.pk}/", headers={"HX-Request": "true"}
    ).content.decode()
    assert "<small>bob</small>" not in toggled

    client.post(done_url(queue, item))
    html = client.get(item_page(item)).content.decode()
    assert "Bob thinks it dawdles" in html
    assert "<small>bob</small>" in html
    assert 'id="done-next"' not in html
    assert 'id="next-item"' in html


def test_without_blind_mode_reviewers_see_each_others_work(alice, bob, project, traces, slow):
    queue = make_queue(project, reviewers_per_item=2)
    item = reserve_next_item(queue=queue, reviewer=bob)
    TraceTag.objects.create(trace=item.trace, tag=slow, reviewer=bob)
    reserve_next_item(queue=queue, reviewer=alice)
    assert "<small>bob</small>" in logged_in(alice).get(item_page(item)).content.decode()


# Agreement


@pytest.fixture
def reviewed(alice, bob, project, traces, slow, rude):
    """alice and bob both finished all four items of a blind queue.

    slow: alice on t-0, t-2; bob on t-0 only.  rude: both on t-3.
    """
    queue = make_queue(project, reviewers_per_item=2, blind=True)
    tagged = {
        "alice": {"t-0": [slow], "t-2": [slow], "t-3": [rude]},
        "bob": {"t-0": [slow], "t-3": [rude]},
    }
    for reviewer in (alice, bob):
        while (item := reserve_next_item(queue=queue, reviewer=reviewer)) is not None:
            for tag in tagged[reviewer.username].get(external_id(item), []):
                TraceTag.objects.create(trace=item.trace, tag=tag, reviewer=reviewer)
            finish_item(item=item, reviewer=reviewer)
    return queue


def test_the_agreement_page_shows_kappa_per_tag(victor, reviewed):
    response = logged_in(victor).get(queue_url(reviewed, "agreement/"))
    assert response.status_code == 200
    html = response.content.decode()
    # slow: alice [1,0,1,0], bob [1,0,0,0] -> p_o 3/4, p_e 1/2, kappa 0.5.  rude: full agreement.
    table = html[html.index('id="agreement"') : html.index('id="adjudication"')]
    rows = {row.split('class="tag">')[1].split("<")[0]: row for row in table.split("<tr>")[2:]}
    assert "Cohen's kappa" in rows["slow"] and "<td>0.500</td>" in rows["slow"]
    assert "<td>1.000</td>" in rows["rude"]


def test_the_adjudication_view_shows_disagreements_side_by_side(alice, reviewed):
    html = logged_in(alice).get(queue_url(reviewed, "agreement/")).content.decode()
    adjudication = html[html.index('id="adjudication"') :]
    disputed = reviewed.items.get(trace__external_id="t-2")
    assert f'/p/acme/traces/{disputed.trace_id}/">#{disputed.position}</a>' in adjudication
    assert '<span class="tag contested">slow</span>' in adjudication
    assert "no tags" in adjudication
    assert adjudication.count("<tr><td><a") == 1  # t-0 and t-3 are agreed


def test_in_a_blind_queue_a_reviewer_adjudicates_only_what_they_finished(
    alice, bob, carol, project, traces, slow
):
    queue = make_queue(project, reviewers_per_item=2, blind=True)
    for reviewer in (alice, bob):
        item = reserve_next_item(queue=queue, reviewer=reviewer)
        if reviewer == alice:
            TraceTag.objects.create(trace=item.trace, tag=slow, reviewer=alice)
        finish_item(item=item, reviewer=reviewer)
    html = logged_in(carol).get(queue_url(queue, "agreement/")).content.decode()
    assert "contested" not in html
    html = logged_in(bob).get(queue_url(queue, "agreement/")).content.decode()
    assert '<span class="tag contested">slow</span>' in html


# A lead's view of a queue


def release_url(queue, item, slug="acme") -> str:
    return queue_url(queue, f"items/{item.pk}/release/", slug)


def reassign_url(queue, item, slug="acme") -> str:
    return queue_url(queue, f"items/{item.pk}/reassign/", slug)


def item_row(html: str, item) -> str:
    start = html.index(f'<tr id="item-{item.pk}"')
    return html[start : html.index("</tr>", start)]


@pytest.fixture
def worked(project, traces, bob, carol, alice):
    """Four items: 1 done by bob, 2 held by carol, 3 skipped by alice, 4 open."""
    queue = make_queue(project)
    _, second, third, _ = queue.items.order_by("position")
    finish_item(item=reserve_next_item(queue=queue, reviewer=bob), reviewer=bob)
    assert reserve_next_item(queue=queue, reviewer=carol) == second
    queue_service.skip_item(item=third, reviewer=alice)
    return queue


def test_the_queue_page_lists_each_item_with_its_state_holder_and_expiry(victor, worked, carol):
    first, second, third, fourth = worked.items.order_by("position")
    html = logged_in(victor).get(queue_url(worked)).content.decode()
    assert "state-done" in item_row(html, first) and "bob" in item_row(html, first)
    held = QueueReview.objects.get(item=second, reviewer=carol)
    until = timezone.localtime(held.reserved_until).strftime("%H:%M")
    assert "state-reserved" in item_row(html, second)
    assert "carol · until <time" in item_row(html, second) and f">{until}</time>" in html
    assert "state-skipped" in item_row(html, third) and "alice" in item_row(html, third)
    assert "state-open" in item_row(html, fourth)
    # A viewer sees the items, not the lead's actions.
    assert "release" not in html and "Reassign" not in html


def test_the_items_filter_by_state_with_counts(victor, worked):
    second = worked.items.get(position=2)
    html = logged_in(victor).get(queue_url(worked), {"state": "reserved"}).content.decode()
    assert html.count('<tr id="item-') == 1 and f'id="item-{second.pk}"' in html
    assert 'reserved <span class="badge">1</span>' in html
    assert 'open <span class="badge">1</span>' in html


def test_an_unknown_state_or_page_is_400_naming_it(victor, worked):
    client = logged_in(victor)
    response = client.get(queue_url(worked), {"state": "lost"})
    assert response.status_code == 400 and b"state must be one of" in response.content
    assert client.get(queue_url(worked), {"page": "x"}).status_code == 400


def test_an_admin_releases_a_reservation_and_the_item_is_open_again(alice, carol, worked):
    second = worked.items.get(position=2)
    response = logged_in(alice).post(release_url(worked, second), {"reviewer": carol.pk})
    assert response.status_code == 302 and response["Location"].endswith(f"#item-{second.pk}")
    assert not QueueReview.objects.filter(item=second, reviewer=carol).exists()
    html = logged_in(alice).get(queue_url(worked)).content.decode()
    assert "state-open" in item_row(html, second)


def test_releasing_what_nobody_holds_is_409(alice, bob, worked):
    fourth = worked.items.get(position=4)
    response = logged_in(alice).post(release_url(worked, fourth), {"reviewer": bob.pk})
    assert response.status_code == 409 and b"bob holds no reservation" in response.content


def test_an_admin_reassigns_a_held_item_to_another_reviewer(alice, bob, carol, worked):
    second = worked.items.get(position=2)
    response = logged_in(alice).post(
        reassign_url(worked, second), {"member": bob.pk, "from": carol.pk}
    )
    assert response.status_code == 302
    assert not QueueReview.objects.filter(item=second, reviewer=carol).exists()
    given = QueueReview.objects.get(item=second, reviewer=bob)
    assert given.status == ReviewStatus.RESERVED and given.reserved_until > timezone.now()
    # The queue serves bob the item he was given.
    assert reserve_next_item(queue=worked, reviewer=bob) == second


def test_giving_a_held_item_without_releasing_its_holder_is_409(alice, bob, worked):
    second = worked.items.get(position=2)
    response = logged_in(alice).post(reassign_url(worked, second), {"member": bob.pk})
    assert response.status_code == 409 and b"every place on this item is taken" in response.content


def test_an_item_is_not_given_to_who_already_reviewed_it(alice, bob, carol, worked):
    first = worked.items.get(position=1)
    finish_item(item=reserve_next_item(queue=worked, reviewer=carol), reviewer=carol)
    response = logged_in(alice).post(reassign_url(worked, first), {"member": bob.pk})
    assert response.status_code == 409 and b"bob has already reviewed" in response.content


def test_an_item_goes_only_to_a_reviewer_of_the_project(alice, victor, mallory, worked):
    fourth = worked.items.get(position=4)
    client = logged_in(alice)
    for someone in (victor, mallory):  # a viewer; another project's member
        response = client.post(reassign_url(worked, fourth), {"member": someone.pk})
        assert response.status_code == 400 and b"member must name a reviewer" in response.content
    assert client.post(reassign_url(worked, fourth), {"member": "x"}).status_code == 400


def test_an_item_of_an_assigned_queue_goes_only_to_its_assignees(
    alice, bob, carol, project, traces
):
    queue = make_queue(project, assignees=[bob])
    response = logged_in(alice).post(reassign_url(queue, queue.items.first()), {"member": carol.pk})
    assert response.status_code == 409 and b"not one of this queue's assignees" in response.content


def test_a_reviewer_cannot_release_reassign_or_write_guidelines(bob, carol, worked):
    second = worked.items.get(position=2)
    client = logged_in(bob)
    assert client.post(release_url(worked, second), {"reviewer": carol.pk}).status_code == 403
    assert client.post(reassign_url(worked, second), {"member": bob.pk}).status_code == 403
    assert client.post(queue_url(worked, "guidelines/"), {"guidelines": "x"}).status_code == 403
    assert QueueReview.objects.get(item=second, reviewer=carol).status == ReviewStatus.RESERVED


def test_another_projects_admin_cannot_release_reassign_or_write_guidelines(mallory, carol, worked):
    second = worked.items.get(position=2)
    client = logged_in(mallory)
    for slug in ("acme", "globex"):
        assert (
            client.post(release_url(worked, second, slug), {"reviewer": carol.pk}).status_code
            == 404
        )
        assert (
            client.post(reassign_url(worked, second, slug), {"member": carol.pk}).status_code == 404
        )
        assert (
            client.post(queue_url(worked, "guidelines/", slug), {"guidelines": "x"}).status_code
            == 404
        )
    assert QueueReview.objects.filter(item=second, reviewer=carol).exists()
    assert Queue.objects.get(pk=worked.pk).guidelines == ""


def test_release_and_reassign_are_posts(alice, worked):
    second = worked.items.get(position=2)
    assert logged_in(alice).get(release_url(worked, second)).status_code == 405
    assert logged_in(alice).get(reassign_url(worked, second)).status_code == 405


GUIDELINES = 'Tag "wrong tool" when the agent <script>alert(1)</script> called the wrong one.'


def test_an_admin_writes_guidelines_every_item_opened_from_the_queue_shows_as_text(
    alice, bob, worked
):
    response = logged_in(alice).post(queue_url(worked, "guidelines/"), {"guidelines": GUIDELINES})
    assert response.status_code == 302
    assert Queue.objects.get(pk=worked.pk).guidelines == GUIDELINES
    escaped = "&lt;script&gt;alert(1)&lt;/script&gt;"
    queue_page = logged_in(bob).get(queue_url(worked)).content.decode()
    assert escaped in queue_page and "<script>alert(1)" not in queue_page
    client = logged_in(bob)
    for _ in range(2):  # every item bob opens from the queue
        item = reserve_next_item(queue=worked, reviewer=bob)
        page = client.get(item_page(item)).content.decode()
        assert 'id="queue-guidelines"' in page and escaped in page
        assert "<script>alert(1)" not in page
        finish_item(item=item, reviewer=bob)
    # The same trace opened from the list is not a queue item: no guidelines.
    plain = client.get(f"/p/acme/traces/{item.trace_id}/").content.decode()
    assert 'id="queue-guidelines"' not in plain


def test_guidelines_over_the_limit_are_400_and_change_nothing(alice, worked):
    too_long = "x" * (queue_service.GUIDELINES_MAX_CHARS + 1)
    response = logged_in(alice).post(queue_url(worked, "guidelines/"), {"guidelines": too_long})
    assert response.status_code == 400 and b"guidelines" in response.content
    assert Queue.objects.get(pk=worked.pk).guidelines == ""


def test_the_progress_bar_counts_each_review_of_a_two_reviewer_queue(alice, bob, project, traces):
    queue = make_queue(project, reviewers_per_item=2, assignees=[alice, bob])
    finish_item(item=reserve_next_item(queue=queue, reviewer=bob), reviewer=bob)
    html = logged_in(alice).get(queue_url(queue)).content.decode()
    # One review of the eight the queue needs: the bar is an eighth full, not empty.
    assert '<progress id="queue-progress-bar" value="1" max="8">' in html
    assert "1 of 8 reviews done" in html
    listed = logged_in(alice).get("/p/acme/queues/").content.decode()
    assert '<progress value="1" max="8">' in listed
