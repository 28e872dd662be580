"""The projects wing's HTML forms: members and their roles."""

from django import forms

from reviewapp.projects.models import Role


class AddMemberForm(forms.Form):
    """An existing user, by username, and the role they get in the project."""

    username = forms.CharField(max_length=150)
    role = forms.ChoiceField(choices=Role.choices, initial=Role.REVIEWER)


class MemberRoleForm(forms.Form):
    role = forms.ChoiceField(choices=Role.choices)
