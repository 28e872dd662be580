"""The trace list's HTML forms beside its filters: saving the filters as a named view."""

from django import forms
from django.http import QueryDict

from reviewapp.projects.models import Project
from reviewapp.traces.filters import TraceFilterForm, filter_query
from reviewapp.traces.models import SavedView

QUERY_MAX_LENGTH = SavedView._meta.get_field("query").max_length


class SavedViewForm(forms.Form):
    """A name for the list's current filters (`query`, the list's query string, rendered with
    the results so it follows every filter change)."""

    name = forms.CharField(max_length=100, label="Name this view")
    shared = forms.BooleanField(required=False, label="Share with the project")
    query = forms.CharField(required=False, widget=forms.HiddenInput)

    def __init__(self, *args, project: Project, **kwargs):
        super().__init__(*args, **kwargs)
        self.project = project

    def clean_query(self) -> str:
        filters = QueryDict(self.cleaned_data["query"])
        form = TraceFilterForm(filters, project=self.project)
        if not form.is_valid():
            problems = "; ".join(
                f"{name}: {' '.join(errors)}" for name, errors in form.errors.items()
            )
            raise forms.ValidationError(f"these filters cannot be saved ({problems})")
        query = filter_query(filters)
        if len(query) > QUERY_MAX_LENGTH:
            raise forms.ValidationError("these filters are too long to save as a view")
        return query
