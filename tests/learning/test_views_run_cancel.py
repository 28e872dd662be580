"""The run page's Cancel: offered for a run in any active phase, to admins; once asked for, the
page says the run will stop and offers it no more."""

import pytest
from django.test import Client

from reviewapp.learning.models import RunStatus, TrainingRun


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.parametrize(
    "status",
    [RunStatus.BUILDING, RunStatus.TRAINING, RunStatus.EVALUATING, RunStatus.DEPLOYING],
)
def test_cancel_on_a_running_run_is_recorded_and_the_page_says_it_will_stop(alice, project, status):
    run = TrainingRun.objects.create(project=project, config={}, status=status)
    page = f"/p/acme/runs/{run.pk}/"
    assert "Cancel run" in logged_in(alice).get(page).content.decode()

    response = logged_in(alice).post(f"{page}cancel/")

    assert response.status_code == 302
    run.refresh_from_db()
    assert (run.status, run.cancel_requested) == (status, True)
    html = logged_in(alice).get(page).content.decode()
    assert 'id="run-cancel-requested"' in html
    assert "Cancel run" not in html


def test_a_reviewer_cannot_cancel_a_run(bob, project):
    run = TrainingRun.objects.create(project=project, config={}, status=RunStatus.EVALUATING)

    response = logged_in(bob).post(f"/p/acme/runs/{run.pk}/cancel/")

    assert response.status_code == 403
    run.refresh_from_db()
    assert not run.cancel_requested
