"""The members page: project admins invite people, add existing users, set their roles and
remove them."""

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from reviewapp.projects.access import get_admin_membership_for_user, get_member_for_membership
from reviewapp.projects.forms import AddMemberForm, InviteForm, MemberRoleForm
from reviewapp.projects.invitations import open_invitations
from reviewapp.projects.members import MemberError, add_member, change_role, remove_member
from reviewapp.projects.models import Membership

# An invitation's link travels to this page after the redirect in the session, removed on display.
NEW_LINK_SESSION_KEY = "new_invitation_link"


def render_members(
    request, admin: Membership, *, form=None, invite_form=None, error: str = "", status: int = 200
):
    """The members page, with the invitations still open and a new invitation's link once."""
    context = {
        "membership": admin,
        "project": admin.project,
        "members": Membership.objects.filter(project=admin.project)
        .select_related("user")
        .order_by("user__username"),
        "form": form or AddMemberForm(),
        "role_form": MemberRoleForm(),
        "invite_form": invite_form or InviteForm(),
        "invitations": open_invitations(admin.project),
        "new_link": request.session.pop(NEW_LINK_SESSION_KEY, None),
        "error": error,
    }
    return render(request, "projects/members.html", context, status=status)


def _get_member_for_admin(user, slug: str, member_id: int) -> tuple[Membership, Membership]:
    """The admin's membership, and the membership of the same project they change."""
    admin = get_admin_membership_for_user(user, slug)
    return admin, get_member_for_membership(admin, member_id)


@login_required
def members(request: HttpRequest, slug: str) -> HttpResponse:
    admin = get_admin_membership_for_user(request.user, slug)
    if request.method != "POST":
        return render_members(request, admin)
    form = AddMemberForm(request.POST)
    if form.is_valid():
        try:
            add_member(project=admin.project, **form.cleaned_data)
        except MemberError as error:
            form.add_error("username", str(error))
        else:
            return redirect("members", slug=slug)  # a reload adds no one twice
    return render_members(request, admin, form=form, status=422)


@require_POST
@login_required
def member_role(request: HttpRequest, slug: str, member_id: int) -> HttpResponse:
    admin, member = _get_member_for_admin(request.user, slug, member_id)
    form = MemberRoleForm(request.POST)
    if not form.is_valid():
        return render_members(request, admin, error="choose admin, reviewer or viewer", status=422)
    try:
        change_role(membership=member, role=form.cleaned_data["role"])
    except MemberError as error:
        return render_members(request, admin, error=str(error), status=422)
    return redirect("members", slug=slug)


@require_POST
@login_required
def member_remove(request: HttpRequest, slug: str, member_id: int) -> HttpResponse:
    admin, member = _get_member_for_admin(request.user, slug, member_id)
    try:
        remove_member(membership=member)
    except MemberError as error:
        return render_members(request, admin, error=str(error), status=422)
    return redirect("members", slug=slug)
