"""Project settings pages: the tag taxonomy (the API keys page is views/api_keys.py)."""

from django import forms
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from reviewapp.models import Tag
from reviewapp.services.review import create_tag
from reviewapp.views.access import (
    get_admin_membership_for_user,
    get_membership_for_user,
)


class TagForm(forms.Form):
    name = forms.SlugField(max_length=100, allow_unicode=True)
    parent = forms.ModelChoiceField(queryset=Tag.objects.none(), required=False)
    description = forms.CharField(max_length=500, required=False)

    def __init__(self, *args, project, **kwargs):
        super().__init__(*args, **kwargs)
        self.project = project
        self.fields["parent"].queryset = Tag.objects.filter(project=project).order_by("name")

    def clean_name(self):
        name = self.cleaned_data["name"]
        if Tag.objects.filter(project=self.project, name=name).exists():
            raise forms.ValidationError(f"there is already a tag {name!r}")
        return name


@login_required
def tag_list(request: HttpRequest, slug: str) -> HttpResponse:
    membership = get_membership_for_user(request.user, slug)
    project = membership.project
    form = TagForm(project=project)
    status = 200
    if request.method == "POST":
        membership = get_admin_membership_for_user(request.user, slug)
        form = TagForm(request.POST, project=project)
        if form.is_valid():
            create_tag(project=project, **form.cleaned_data)
            if not request.htmx:
                return redirect("tag_list", slug=slug)
            form = TagForm(project=project)
        else:
            status = 422
    context = {
        "membership": membership,
        "project": project,
        "form": form,
        "tags": Tag.objects.filter(project=project).select_related("parent").order_by("name"),
    }
    if request.htmx:
        return render(request, "projects/tags.html#taxonomy", context, status=status)
    return render(request, "projects/tags.html", context, status=status)
