"""Invitations: admins make and revoke one-time links on the members page; opening a link
makes an account (or takes the signed-in one) and joins the project in the invited role."""

from django.contrib.auth import login
from django.contrib.auth.decorators import login_required
from django.contrib.auth.forms import UserCreationForm
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from reviewapp.projects.access import first_or_404, get_admin_membership_for_user
from reviewapp.projects.forms import InviteForm
from reviewapp.projects.invitations import (
    InvitationError,
    accept_invitation,
    create_invitation,
    invitation_for_token,
    revoke_invitation,
    sign_up_by_invitation,
)
from reviewapp.projects.models import Invitation
from reviewapp.projects.views.members import NEW_LINK_SESSION_KEY, render_members

# Sessions made by accepting an invitation log in through the model backend (not axes: no
# password was tried against an existing account).
MODEL_BACKEND = "django.contrib.auth.backends.ModelBackend"


@require_POST
@login_required
def invitation_create(request: HttpRequest, slug: str) -> HttpResponse:
    admin = get_admin_membership_for_user(request.user, slug)
    form = InviteForm(request.POST)
    if not form.is_valid():
        return render_members(request, admin, invite_form=form, status=422)
    token = create_invitation(project=admin.project, invited_by=request.user, **form.cleaned_data)[
        1
    ]
    link = request.build_absolute_uri(reverse("invitation_accept", args=[token]))
    request.session[NEW_LINK_SESSION_KEY] = link
    return redirect("members", slug=slug)


@require_POST
@login_required
def invitation_revoke(request: HttpRequest, slug: str, invitation_id: int) -> HttpResponse:
    admin = get_admin_membership_for_user(request.user, slug)
    invitations = Invitation.objects.filter(project=admin.project, pk=invitation_id)
    revoke_invitation(invitation=first_or_404(invitations, "no such invitation"))
    return redirect("members", slug=slug)


def invitation_accept(request: HttpRequest, token: str) -> HttpResponse:
    """Signed in: a button joins this account. Not signed in: a new account, or log in first."""
    invitation = invitation_for_token(token)
    if invitation is None:
        raise Http404("no such invitation")
    context = {"invitation": invitation, "project": None, "form": None, "error": ""}
    closed = invitation.closed_because(timezone.now())
    if closed:
        context["error"] = f"This invitation no longer works: {closed}."
        return render(request, "projects/invitation.html", context, status=410)
    signed_in = request.user.is_authenticated
    form = None if signed_in else UserCreationForm(request.POST or None)
    if request.method == "POST" and (form is None or form.is_valid()):
        try:
            if signed_in:
                accept_invitation(invitation=invitation, user=request.user)
            else:
                membership = sign_up_by_invitation(
                    invitation=invitation,
                    username=form.cleaned_data["username"],
                    password=form.cleaned_data["password1"],
                )
                login(request, membership.user, backend=MODEL_BACKEND)
        except InvitationError as error:
            context["error"] = str(error)
            return render(request, "projects/invitation.html", context, status=409)
        return redirect("trace_list", slug=invitation.project.slug)
    status = 422 if request.method == "POST" else 200
    context["form"] = form
    return render(request, "projects/invitation.html", context, status=status)
