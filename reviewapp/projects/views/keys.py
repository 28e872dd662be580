"""The API keys page: create keys with scopes, see what each may do, revoke them."""

from django import forms
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from reviewapp.projects.access import get_admin_membership_for_user
from reviewapp.projects.models import ApiKey, KeyScope
from reviewapp.projects.services import create_api_key, revoke_api_key

# The secret travels to the page after the redirect in the session and is removed on display.
NEW_SECRET_SESSION_KEY = "new_api_key_secret"


class ApiKeyForm(forms.Form):
    name = forms.CharField(max_length=100, required=False)
    scopes = forms.MultipleChoiceField(
        choices=KeyScope.choices,
        initial=[KeyScope.INGEST],
        widget=forms.CheckboxSelectMultiple,
        error_messages={"required": "choose at least one scope (a harness needs only ingest)"},
    )


@login_required
def api_keys(request: HttpRequest, slug: str) -> HttpResponse:
    membership = get_admin_membership_for_user(request.user, slug)
    form = ApiKeyForm()
    status = 200
    if request.method == "POST":
        form = ApiKeyForm(request.POST)
        if form.is_valid():
            secret = create_api_key(project=membership.project, **form.cleaned_data)[1]
            request.session[NEW_SECRET_SESSION_KEY] = secret
            # Post/redirect/get: reloading the page shows the keys, it does not make another.
            return redirect("api_keys", slug=slug)
        status = 422
    context = {
        "membership": membership,
        "project": membership.project,
        "keys": ApiKey.objects.filter(project=membership.project).order_by("-created_at"),
        "new_secret": request.session.pop(NEW_SECRET_SESSION_KEY, None),
        "form": form,
    }
    return render(request, "projects/keys.html", context, status=status)


@require_POST
@login_required
def api_key_revoke(request: HttpRequest, slug: str, key_id: int) -> HttpResponse:
    membership = get_admin_membership_for_user(request.user, slug)
    key = ApiKey.objects.filter(project=membership.project, pk=key_id).first()
    if key is not None:
        revoke_api_key(key=key)
    return redirect("api_keys", slug=slug)
