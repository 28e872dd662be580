"""Project settings pages: the tag taxonomy (the API keys page is views/api_keys.py)."""

from django import forms
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from reviewapp.fragments import render_page
from reviewapp.projects.access import get_admin_membership_for_user, get_membership_for_user
from reviewapp.review.access import get_tag_for_membership
from reviewapp.review.tags import TagError, create_tag, delete_tag, merge_tag, rename_tag
from reviewapp.traces.models import Tag


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


class RenameTagForm(forms.Form):
    name = forms.SlugField(max_length=100, allow_unicode=True, label="Rename to")


class MergeTagForm(forms.Form):
    into = forms.ModelChoiceField(queryset=Tag.objects.none(), label="Merge into")

    def __init__(self, *args, tag: Tag, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["into"].queryset = Tag.objects.filter(project_id=tag.project_id).exclude(
            pk=tag.pk
        )


def _get_tag_for_admin(request: HttpRequest, slug: str, tag_id: int):
    membership = get_admin_membership_for_user(request.user, slug)
    return membership, get_tag_for_membership(membership, tag_id)


def _render_taxonomy(request, membership, *, form=None, error="", status=200) -> HttpResponse:
    project = membership.project
    tags = list(Tag.objects.filter(project=project).select_related("parent").order_by("name"))
    context = {
        "membership": membership,
        "project": project,
        "form": form or TagForm(project=project),
        "tags": tags,
        "tag_error": error,
    }
    return render_page(request, "review/tags.html", context, fragment="taxonomy", status=status)


@login_required
def tag_list(request: HttpRequest, slug: str) -> HttpResponse:
    membership = get_membership_for_user(request.user, slug)
    project = membership.project
    if request.method != "POST":
        return _render_taxonomy(request, membership)
    membership = get_admin_membership_for_user(request.user, slug)
    form = TagForm(request.POST, project=project)
    if not form.is_valid():
        return _render_taxonomy(request, membership, form=form, status=422)
    create_tag(project=project, **form.cleaned_data)
    if not request.htmx:
        return redirect("tag_list", slug=slug)
    return _render_taxonomy(request, membership)


def _taxonomy_after(request, slug, membership, change) -> HttpResponse:
    """Apply a rename, merge or delete; a refused one re-renders the taxonomy with its reason."""
    try:
        change()
    except TagError as error:
        return _render_taxonomy(request, membership, error=str(error), status=422)
    if not request.htmx:
        return redirect("tag_list", slug=slug)
    return _render_taxonomy(request, membership)


def _taxonomy_after_form(request, slug, membership, tag: Tag, form, change) -> HttpResponse:
    """A rename or merge: its one-field form's value goes to `change`; an invalid value
    re-renders the taxonomy with the tag's name and the field's error."""
    if not form.is_valid():
        (field_errors,) = form.errors.values()
        return _render_taxonomy(
            request, membership, error=f"{tag.name}: {field_errors[0]}", status=422
        )
    (value,) = form.cleaned_data.values()
    return _taxonomy_after(request, slug, membership, lambda: change(value))


@require_POST
@login_required
def tag_rename(request: HttpRequest, slug: str, tag_id: int) -> HttpResponse:
    membership, tag = _get_tag_for_admin(request, slug, tag_id)
    form = RenameTagForm(request.POST)
    return _taxonomy_after_form(
        request, slug, membership, tag, form, lambda name: rename_tag(tag=tag, name=name)
    )


@require_POST
@login_required
def tag_merge(request: HttpRequest, slug: str, tag_id: int) -> HttpResponse:
    membership, tag = _get_tag_for_admin(request, slug, tag_id)
    form = MergeTagForm(request.POST, tag=tag)
    return _taxonomy_after_form(
        request, slug, membership, tag, form, lambda into: merge_tag(source=tag, into=into)
    )


@require_POST
@login_required
def tag_delete(request: HttpRequest, slug: str, tag_id: int) -> HttpResponse:
    membership, tag = _get_tag_for_admin(request, slug, tag_id)
    return _taxonomy_after(request, slug, membership, lambda: delete_tag(tag=tag))
