"""The settings page: admins edit the project's settings on the typed schema, every problem
beside its field and nothing stored while one remains; the trust rules of the API apply."""

import pytest
from django.test import Client

from reviewapp.projects.forms import ProjectSettingsForm
from reviewapp.projects.models import Project
from reviewapp.projects.project_settings import settings_for

URL = "/p/acme/settings/"


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def submitted(project: Project, **changes) -> dict:
    """The form as the page sends it for the stored settings, with `changes` typed in."""
    form = ProjectSettingsForm(stored=project.settings)
    values = {"name": project.name, "served_model": project.served_model}
    values.update({name: form[name].value() for name in form.fields})
    values.update(changes)
    # An unticked checkbox is not sent at all.
    return {
        name: value for name, value in values.items() if value is not None and value is not False
    }


def field_errors(response, name: str) -> list[str]:
    return list(response.context["form"].errors.get(name, []))


def test_it_shows_every_section_with_the_stored_values(alice, project):
    project.settings = {"training": {"lora_r": 8}, "canary_share": 25}
    project.save()

    html = logged_in(alice).get(URL).content.decode()

    for legend in ("Training", "Evaluation gate", "Data policy", "Teacher", "Approval and deploy"):
        assert f"<legend>{legend}</legend>" in html
    assert 'name="training.lora_r" value="8"' in html
    assert 'name="canary_share" value="25"' in html
    assert 'name="training.epochs"' in html and "default: 3" in html


def test_it_saves_the_settings_and_shows_them_again(alice, project):
    data = submitted(
        project,
        **{"training.lora_r": "8", "data_policy.timeout": "exclude", "canary_share": "30"},
    )
    client = logged_in(alice)
    response = client.post(URL, data)

    assert response.status_code == 302
    saved = settings_for(Project.objects.get(pk=project.pk))
    assert saved.training.overrides() == {"lora_r": 8}  # blank fields stay the library's default
    assert saved.data_policy.timeout == "exclude"
    assert saved.canary_share == 30
    page = client.get(URL).content.decode()
    assert "Settings saved." in page
    assert 'name="training.lora_r" value="8"' in page
    assert 'name="canary_share" value="30"' in page


def test_the_preference_term_is_a_training_setting_on_followed_lessons_by_default(alice, project):
    client = logged_in(alice)

    html = client.get(URL).content.decode()
    response = client.post(
        URL,
        submitted(
            project,
            **{"training.preference_weight": "1.5", "training.preference_lessons": "all"},
        ),
    )

    assert 'name="training.preference_weight"' in html
    assert 'name="training.preference_beta"' in html
    assert 'name="training.preference_lessons"' in html
    form = ProjectSettingsForm(stored={})
    assert form.fields["training.preference_weight"].help_text == "default: 1.0"
    assert form.fields["training.preference_beta"].help_text == "default: 0.1"
    assert form.fields["training.preference_lessons"].choices[0] == ("", "default (followed)")
    assert response.status_code == 302
    saved = settings_for(Project.objects.get(pk=project.pk))
    assert saved.training.overrides() == {"preference_weight": 1.5, "preference_lessons": "all"}
    config = saved.training_config(mode="sft")
    assert (config.preference_weight, config.preference_lessons) == (1.5, "all")


def test_the_name_and_model_alias_are_saved_with_the_settings(alice, project):
    data = submitted(project, name="Acme agent", served_model="acme-agent", canary_share="40")

    assert logged_in(alice).post(URL, data).status_code == 302

    saved = Project.objects.get(pk=project.pk)
    assert (saved.name, saved.served_model) == ("Acme agent", "acme-agent")
    assert saved.settings["canary_share"] == 40


def test_a_refused_setting_keeps_the_name_and_alias_unsaved(alice, project):
    data = submitted(project, served_model="acme-agent", **{"training.epochs": "0"})

    response = logged_in(alice).post(URL, data)

    assert response.status_code == 422
    assert field_errors(response, "training.epochs")
    saved = Project.objects.get(pk=project.pk)
    assert saved.served_model == "SmolLM2-135M-Instruct" and saved.settings == {}


def test_a_blank_model_alias_is_refused_beside_it_and_nothing_is_saved(alice, project):
    response = logged_in(alice).post(URL, submitted(project, served_model="", canary_share="40"))

    assert response.status_code == 422
    assert response.context["project_form"].errors["served_model"] == ["This field is required."]
    assert Project.objects.get(pk=project.pk).settings == {}


def test_each_problem_is_shown_beside_its_field_and_nothing_is_saved(alice, project):
    data = submitted(
        project,
        **{
            "training.lora_r": "0",
            "gate.min_fixed_fraction": "1.5",
            "data_policy.timeout": "exclude",
        },
    )
    response = logged_in(alice).post(URL, data)

    assert response.status_code == 422
    assert any(
        "greater than or equal to 1" in error for error in field_errors(response, "training.lora_r")
    )
    assert any(
        "less than or equal to 1" in error
        for error in field_errors(response, "gate.min_fixed_fraction")
    )
    assert "Nothing was saved" in response.content.decode()
    assert Project.objects.get(pk=project.pk).settings == {}
    assert 'name="training.lora_r" value="0"' in response.content.decode()  # as typed


def test_a_value_of_the_wrong_type_is_refused_beside_its_field(alice, project):
    response = logged_in(alice).post(URL, submitted(project, **{"canary_share": "many"}))

    assert response.status_code == 422
    assert field_errors(response, "canary_share") == ["Enter a whole number."]
    assert Project.objects.get(pk=project.pk).settings == {}


def test_a_cross_field_rule_of_the_training_config_lands_on_its_field(alice, project):
    data = submitted(
        project,
        **{"training.per_device_batch_size": "64", "training.gradient_accumulation_steps": "64"},
    )
    response = logged_in(alice).post(URL, data)

    assert response.status_code == 422
    errors = response.context["form"].errors
    assert any(name.startswith("training.") for name in errors)
    assert Project.objects.get(pk=project.pk).settings == {}


def test_an_upstream_the_operator_does_not_offer_is_refused(alice, project, settings):
    settings.MODEL_SERVERS = ["http://vllm-a:8000/v1"]
    data = submitted(project, upstreams="http://vllm-a:8000/v1\nhttp://elsewhere.example/v1")

    response = logged_in(alice).post(URL, data)

    assert response.status_code == 422
    [error] = field_errors(response, "upstreams")
    assert "not one of this deployment's servers (MODEL_SERVERS)" in error
    assert Project.objects.get(pk=project.pk).settings == {}


def test_an_offered_upstream_and_teacher_are_saved(alice, project, settings):
    settings.MODEL_SERVERS = ["http://vllm-a:8000/v1", "http://vllm-b:8000/v1"]
    settings.TEACHER_API_KEYS = {"big": "BIG_TEACHER_KEY"}
    data = submitted(
        project,
        upstreams="http://vllm-a:8000/v1\nhttp://vllm-b:8000/v1/",
        **{"teacher.url": "http://vllm-b:8000/v1", "teacher.key_name": "big"},
    )
    response = logged_in(alice).post(URL, data)

    assert response.status_code == 302
    saved = settings_for(Project.objects.get(pk=project.pk))
    assert saved.upstreams == ["http://vllm-a:8000/v1", "http://vllm-b:8000/v1"]
    assert (saved.teacher.url, saved.teacher.key_name) == ("http://vllm-b:8000/v1", "big")


def test_a_teacher_key_the_operator_does_not_declare_is_refused(alice, project, settings):
    settings.TEACHER_API_KEYS = {}
    response = logged_in(alice).post(
        URL, submitted(project, **{"teacher.key_name": "OPENAI_API_KEY"})
    )

    assert response.status_code == 422
    [error] = field_errors(response, "teacher.key_name")
    assert "not a teacher key this deployment declares" in error


def test_a_withdrawn_upstream_does_not_block_other_sections(alice, project, settings):
    project.settings = {"upstreams": ["http://gone:8000/v1"]}
    project.save()
    settings.MODEL_SERVERS = []

    response = logged_in(alice).post(URL, submitted(project, canary_share="10"))

    assert response.status_code == 302
    assert Project.objects.get(pk=project.pk).settings["canary_share"] == 10


@pytest.mark.parametrize("method", ["get", "post"])
def test_it_forbids_reviewers_and_viewers_with_the_styled_page(bob, victor, project, method):
    for user in (bob, victor):
        response = getattr(logged_in(user), method)(URL, {"canary_share": "5"})
        assert response.status_code == 403
        assert "<h1>You cannot open this page</h1>" in response.content.decode()
        assert "Only project admins can do this." in response.content.decode()
    assert Project.objects.get(pk=project.pk).settings == {}


def test_it_is_linked_in_the_nav_for_admins_only(alice, bob):
    assert f'href="{URL}"' in logged_in(alice).get("/p/acme/traces/").content.decode()
    assert f'href="{URL}"' not in logged_in(bob).get("/p/acme/traces/").content.decode()
