"""PATCH /api/v1/settings refuses an absurd training or gate value with 422 naming the field
under its section, and stores nothing."""

import pytest

from reviewapp.projects.models import Project


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"training": {"epochs": 1e11}}, "training.epochs"),
        ({"training": {"epochs": 10**11}}, "training.epochs"),
        ({"training": {"max_seq_len": 10**9}}, "training.max_seq_len"),
        ({"training": {"learning_rate": 5.0}}, "training.learning_rate"),
        ({"gate": {"max_mean_drift": 1e11}}, "gate.max_mean_drift"),
        ({"gate": {"min_fixed_fraction": 2}}, "gate.min_fixed_fraction"),
    ],
)
def test_an_absurd_value_is_answered_422_naming_the_field(project, admin_api, changes, field):
    response = admin_api.patch("/api/v1/settings", changes)

    assert response.status_code == 422, response.content
    assert response.json()["detail"].startswith(f"{field}: ")
    assert Project.objects.get(pk=project.pk).settings == {}


def test_a_large_real_value_is_stored(project, admin_api):
    response = admin_api.patch("/api/v1/settings", {"training": {"epochs": 100}})

    assert response.status_code == 200, response.content
    assert response.json()["training"]["epochs"] == 100
