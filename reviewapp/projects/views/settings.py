"""The settings page: a project's admins edit its name, model alias and settings (the typed
schema), saved together or not at all."""

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from reviewapp.projects.access import get_admin_membership_for_user
from reviewapp.projects.forms import SECTION_TITLES, ProjectForm, ProjectSettingsForm
from reviewapp.projects.outbound import allowed_teachers, allowed_upstreams, declared_teacher_keys
from reviewapp.projects.project_settings import SettingsError
from reviewapp.projects.services import update_project

SAVED_SESSION_KEY = "project_settings_saved"


@login_required
def project_settings(request: HttpRequest, slug: str) -> HttpResponse:
    """All valid or nothing stored: each problem is shown beside its field, values as typed."""
    membership = get_admin_membership_for_user(request.user, slug)
    project = membership.project
    project_form = ProjectForm(initial={"name": project.name, "served_model": project.served_model})
    form = ProjectSettingsForm(stored=project.settings)
    status = 200
    if request.method == "POST":
        project_form = ProjectForm(request.POST)
        form = ProjectSettingsForm(request.POST, stored=project.settings)
        if all([project_form.is_valid(), form.is_valid()]):  # both, so both show their errors
            try:
                update_project(
                    project=project,
                    **project_form.cleaned_data,
                    settings_changes=form.changed_sections(),
                )
            except SettingsError as error:
                form.add_problems(error.problems)
            else:
                request.session[SAVED_SESSION_KEY] = True
                return redirect("project_settings", slug=slug)  # a reload saves nothing twice
        status = 422
    context = {
        "membership": membership,
        "project": project,
        "project_form": project_form,
        "form": form,
        "sections": [
            (SECTION_TITLES[name], [form[field] for field in fields])
            for name, fields in form.sections
        ],
        "saved": request.session.pop(SAVED_SESSION_KEY, False),
        "allowed_upstreams": allowed_upstreams(project),
        "allowed_teachers": allowed_teachers(project),
        "teacher_keys": declared_teacher_keys(),
    }
    return render(request, "projects/settings.html", context, status=status)
