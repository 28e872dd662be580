"""A project's settings: one typed schema, refused values name the field, at the API too."""

import pytest

from reviewapp.learning.runs import RetrainError, start_retrain
from reviewapp.projects.models import Project
from reviewapp.projects.project_settings import SettingsError, settings_for, update_settings


def test_defaults_fill_in_what_is_not_stored(project):
    stored = settings_for(project)

    assert (stored.auto_approve, stored.auto_deploy, stored.canary_share) == ("manual", True, 100)
    assert stored.data_policy.timeout == "keep"


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"canary_share": 0}, "canary_share"),
        ({"auto_approve": "always"}, "auto_approve"),
        ({"data_policy": {"timeout": "drop"}}, "data_policy.timeout"),
        ({"training": {"lora_r": 0}}, "lora_r"),
        ({"training": {"mode": "distill"}}, "training"),
        ({"gate": {"max_regressed": -1}}, "gate"),
        ({"teacher": {"api_key_env": "HOME"}}, "teacher.api_key_env"),
        ({"teacher": {"url": "file:///etc/passwd"}}, "teacher.url"),
        ({"teacher": {"url": "gopher://127.0.0.1:70/v1"}}, "teacher.url"),
        ({"upstreams": ["http://[::1"]}, "upstreams"),
        ({"colour": "blue"}, "colour"),
    ],
)
def test_a_bad_value_is_refused_naming_the_field_and_nothing_is_stored(project, changes, field):
    with pytest.raises(SettingsError, match=field):
        update_settings(project=project, changes=changes)

    assert Project.objects.get(pk=project.pk).settings == {}


def test_a_valid_change_is_stored_and_keeps_the_other_sections(project):
    update_settings(project=project, changes={"auto_approve": "checks_pass"})
    update_settings(project=project, changes={"training": {"min_steps": 8}})

    stored = settings_for(Project.objects.get(pk=project.pk))
    assert (stored.auto_approve, stored.training_config(mode="sft").min_steps) == (
        "checks_pass",
        8,
    )


def test_a_run_records_the_project_training_settings_as_its_config(project, approved_target):
    update_settings(project=project, changes={"training": {"min_steps": 8, "lora_r": 4}})

    run = start_retrain(project=project)

    assert (run.config["min_steps"], run.config["lora_r"], run.config["mode"]) == (8, 4, "sft")


def test_a_retrain_on_invalid_stored_settings_says_which_field(project, approved_target):
    Project.objects.filter(pk=project.pk).update(settings={"canary_share": 500})
    project.refresh_from_db()

    with pytest.raises(RetrainError, match="canary_share"):
        start_retrain(project=project)


def test_the_api_reads_the_settings_with_defaults(admin_api):
    body = admin_api.get("/api/v1/settings").json()

    assert body["auto_deploy"] is True
    assert body["data_policy"] == {
        "timeout": "keep",
        "tool_error": "keep",
        "failing_checks": "exclude",
    }


def test_the_api_refuses_a_bad_value_with_422_naming_the_field(admin_api, project):
    response = admin_api.patch("/api/v1/settings", {"training": {"learning_rate": -1}})

    assert response.status_code == 422
    assert "learning_rate" in response.json()["detail"]
    assert Project.objects.get(pk=project.pk).settings == {}


def test_the_api_stores_a_valid_change(admin_api, project):
    response = admin_api.patch("/api/v1/settings", {"auto_deploy": False})

    assert response.status_code == 200
    assert settings_for(Project.objects.get(pk=project.pk)).auto_deploy is False


def test_an_ingest_key_cannot_change_the_settings(api, project):
    response = api.patch("/api/v1/settings", {"auto_deploy": False})

    assert response.status_code == 403
    assert Project.objects.get(pk=project.pk).settings == {}
