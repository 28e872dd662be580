"""The review wing's HTML forms: feedback on a trace, a new queue, the trace list's bulk
actions."""

import json

from django import forms
from django.contrib.auth import get_user_model

from reviewapp.projects.models import Project, Role
from reviewapp.review.feedback import MAX_FEEDBACK_TEXT_LENGTH
from reviewapp.review.models import Queue
from reviewapp.review.queues import MAX_QUEUE_ITEMS
from reviewapp.traces.filters import TraceFilterForm, filter_query
from reviewapp.traces.models import Tag, Trace
from reviewapp.traces.rendering import TurnView
from training.checks import check_problem


class FeedbackForm(forms.Form):
    anchor = forms.ChoiceField(label="About")
    text = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3}), max_length=MAX_FEEDBACK_TEXT_LENGTH
    )
    rating = forms.TypedChoiceField(
        choices=[("", "no rating"), ("1", "good"), ("-1", "bad")],
        coerce=float,
        empty_value=None,
        required=False,
    )
    correction_text = forms.CharField(
        label="Corrected reply", widget=forms.Textarea(attrs={"rows": 3}), required=False
    )
    correction_tool = forms.CharField(label="…or corrected tool call: tool", required=False)
    correction_arguments = forms.CharField(
        label="arguments (JSON)", widget=forms.Textarea(attrs={"rows": 2}), required=False
    )
    check_regex = forms.CharField(label="Must match (regex)", required=False)
    check_not_regex = forms.CharField(label="Must not match (regex)", required=False)
    check_max_words = forms.IntegerField(label="At most N words", min_value=1, required=False)
    check_calls_tool = forms.CharField(label="Must call tool", required=False)
    check_no_tool_call = forms.BooleanField(label="Must call no tool", required=False)
    check_argument_tool = forms.CharField(label="Each call to tool", required=False)
    check_argument_name = forms.CharField(label="has argument", required=False)
    check_argument_pattern = forms.CharField(label="matching (regex)", required=False)
    check_argument_schema = forms.CharField(
        label="…or its arguments fit (JSON Schema)",
        widget=forms.Textarea(attrs={"rows": 2}),
        required=False,
    )
    check_max_tool_calls = forms.IntegerField(
        label="At most N tool calls", min_value=0, required=False
    )
    check_max_tool_calls_tool = forms.CharField(label="to tool (blank: any)", required=False)
    check_answers_after_tool_success = forms.BooleanField(
        label="Answers only after a tool result that did not fail", required=False
    )

    def __init__(self, *args, turns: list[TurnView], **kwargs):
        super().__init__(*args, **kwargs)
        # Feedback is about what the model did: its replies and its tool calls, never the user's
        # or a tool's messages; on a long trace each reply shows its opening words to find it by.
        replies, calls = [], []
        for turn in turns:
            if turn.role != "assistant":
                continue
            opening = " ".join(turn.text.split()[:8]) or (
                "tool calls" if turn.tool_calls else "(empty)"
            )
            replies.append((f"turn:{turn.index}", f"#{turn.index} {opening}"))
            for call in turn.tool_calls:
                calls.append((f"call:{call.id}", f"#{turn.index} {call.name} ({call.id})"))
        choices = [("trace", "the whole trace"), ("Assistant replies", replies)]
        self.fields["anchor"].choices = choices + ([("Tool calls", calls)] if calls else [])

    def extra_fields(self):
        """The fields folded under "Correction and checks"."""
        folded = ("anchor", "text", "rating")
        return [field for field in self if field.name not in folded]

    def clean(self):
        data = super().clean()
        if data.get("correction_arguments") and not data.get("correction_tool"):
            self.add_error("correction_tool", "name the tool the corrected call uses")
        if data.get("correction_tool"):
            try:
                json.loads(data.get("correction_arguments") or "{}")
            except ValueError as error:
                self.add_error("correction_arguments", f"not valid JSON ({error})")
        data["checks"] = []
        for check, fields in self._requested_checks(data):
            problem = check_problem(check["kind"], check["value"])
            if problem:  # shown at the field it is about ("value.schema: ..." at the schema's)
                where, _, reason = problem.partition(": ")
                self.add_error(fields.get(where, fields["value"]), reason)
            data["checks"].append(check)
        return data

    def _requested_checks(self, data: dict) -> list[tuple[dict, dict[str, str]]]:
        """The checks the filled-in fields ask for, each with the form field of each part of
        its value (`value`, `value.tool`, ...)."""
        requested = [
            ({"kind": kind, "value": data[f"check_{kind}"]}, {"value": f"check_{kind}"})
            for kind in ("regex", "not_regex", "max_words", "calls_tool")
            if data.get(f"check_{kind}") not in (None, "")
        ]
        for kind in ("no_tool_call", "answers_after_tool_success"):
            if data.get(f"check_{kind}"):
                requested.append(({"kind": kind, "value": True}, {"value": f"check_{kind}"}))
        argument_fields = {
            "value": "check_argument_tool",
            "value.tool": "check_argument_tool",
            "value.argument": "check_argument_name",
            "value.pattern": "check_argument_pattern",
            "value.schema": "check_argument_schema",
        }
        if any(data.get(field) for field in argument_fields.values()):
            value = {"tool": data.get("check_argument_tool")}
            if data.get("check_argument_name") or data.get("check_argument_pattern"):
                value["argument"] = data.get("check_argument_name")
                value["pattern"] = data.get("check_argument_pattern")
            if data.get("check_argument_schema"):
                try:
                    value["schema"] = json.loads(data["check_argument_schema"])
                except (ValueError, RecursionError) as error:  # nested past what json decodes
                    self.add_error("check_argument_schema", f"not valid JSON ({error})")
            if not self.has_error("check_argument_schema"):
                requested.append(({"kind": "tool_argument", "value": value}, argument_fields))
        if data.get("check_max_tool_calls") is not None:
            value = {"max": data["check_max_tool_calls"]}
            if data.get("check_max_tool_calls_tool"):
                value["tool"] = data["check_max_tool_calls_tool"]
            fields = {"value": "check_max_tool_calls", "value.tool": "check_max_tool_calls_tool"}
            requested.append(({"kind": "max_tool_calls", "value": value}, fields))
        elif data.get("check_max_tool_calls_tool"):
            self.add_error("check_max_tool_calls", "give the most calls the tool may have")
        return requested

    def feedback_kwargs(self) -> dict:
        """The cleaned form as record_feedback's keyword arguments."""
        data = self.cleaned_data
        kind, _, value = data["anchor"].partition(":")
        correction = None
        if data["correction_tool"]:
            function = {
                "name": data["correction_tool"],
                "arguments": data["correction_arguments"] or "{}",
            }
            correction = {
                "role": "assistant",
                "content": data["correction_text"] or None,
                "tool_calls": [{"id": "call_corrected", "type": "function", "function": function}],
            }
        elif data["correction_text"]:
            correction = {"role": "assistant", "content": data["correction_text"]}
        return {
            "text": data["text"],
            "turn": int(value) if kind == "turn" else None,
            "tool_call_id": value if kind == "call" else None,
            "rating": data["rating"],
            "correction": correction,
            "checks": data["checks"],
        }


class QueueForm(TraceFilterForm):
    """The trace-list filters plus how the queue is worked."""

    name = forms.CharField(max_length=200)
    sample_size = forms.IntegerField(
        min_value=1,
        max_value=MAX_QUEUE_ITEMS,
        required=False,
        help_text="Blank: every matching trace.",
    )
    seed = forms.IntegerField(required=False, help_text="The same seed draws the same sample.")
    reviewers_per_item = forms.IntegerField(min_value=1, max_value=10, initial=1)
    blind = forms.BooleanField(
        required=False, help_text="Reviewers see nobody else's tags or feedback until done."
    )
    assignees = forms.ModelMultipleChoiceField(
        queryset=get_user_model().objects.none(),
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="None ticked: any reviewer of the project.",
    )

    def __init__(self, *args, project, **kwargs):
        super().__init__(*args, project=project, **kwargs)
        self.fields["assignees"].queryset = (
            get_user_model()
            .objects.filter(
                memberships__project=project, memberships__role__in=[Role.ADMIN, Role.REVIEWER]
            )
            .order_by("username")
        )

    def filter_fields(self) -> list[forms.BoundField]:
        return [self[name] for name in TraceFilterForm.base_fields]

    def queue_fields(self) -> list[forms.BoundField]:
        return [self[name] for name in self.fields if name not in TraceFilterForm.base_fields]

    def filters(self) -> dict:
        return {name: self.cleaned_data[name] for name in TraceFilterForm.base_fields}

    def filter_query(self) -> str:
        """The filters as a trace-list query string, so the queue links back to its traces."""
        return filter_query(self.data)


# The most traces one bulk action takes: a page of the list and the pages scrolled in after it.
MAX_BULK_TRACES = 500


class BulkActionForm(forms.Form):
    """What to do to the traces ticked on the trace list (looked up by the view, so another
    project's trace is a 404 before any form sees it). The three actions share one form on
    the page, each with its own button: no field is marked required there."""

    use_required_attribute = False
    prefix = "bulk"

    def __init__(self, *args, project: Project, traces: list[Trace], **kwargs):
        super().__init__(*args, **kwargs)
        self.project = project
        self.traces = traces

    def clean(self):
        if not self.traces:
            raise forms.ValidationError(
                "No traces selected: tick the traces to act on (or “select all on this page”)."
            )
        if len(self.traces) > MAX_BULK_TRACES:
            raise forms.ValidationError(
                f"{len(self.traces)} traces selected; one action takes at most {MAX_BULK_TRACES}."
            )
        return super().clean()


class BulkTagForm(BulkActionForm):
    tag = forms.ModelChoiceField(
        queryset=Tag.objects.none(),
        empty_label="choose a tag",
        label="Add the tag",
        error_messages={"required": "Choose the tag to add."},
    )

    def __init__(self, *args, project: Project, **kwargs):
        super().__init__(*args, project=project, **kwargs)
        self.fields["tag"].queryset = Tag.objects.filter(project=project).order_by("name")


class BulkQueueForm(BulkActionForm):
    queue = forms.ModelChoiceField(
        queryset=Queue.objects.none(),
        empty_label="choose a queue",
        label="Add to the queue",
        error_messages={"required": "Choose the queue to add them to."},
    )

    def __init__(self, *args, project: Project, **kwargs):
        super().__init__(*args, project=project, **kwargs)
        self.fields["queue"].queryset = Queue.objects.filter(project=project).order_by(
            "-created_at", "-id"
        )


class BulkFeedbackForm(BulkActionForm):
    text = forms.CharField(
        label="Feedback for each (about the trace, not one turn)",
        widget=forms.Textarea(attrs={"rows": 2}),
        max_length=MAX_FEEDBACK_TEXT_LENGTH,
        error_messages={"required": "Write the feedback to add to each."},
    )
