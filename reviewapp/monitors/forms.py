"""The monitors wing's HTML forms: triage rules, feedback applied to similar traces, the
monitors' filters."""

from django import forms

from reviewapp.monitors.models import TriageRule
from reviewapp.monitors.triage import ANY_TOOL
from reviewapp.review.models import Feedback, Queue
from reviewapp.traces.filters import TraceFilterForm
from reviewapp.traces.models import Tag, Trace

CONDITION_FIELDS = (
    "termination",
    "min_tool_calls",
    "failed_tool",
    "tag",
    "model",
    "adapter_version",
    "outcome",
    "text",
)


class TriageRuleForm(forms.ModelForm):
    new_queue = forms.CharField(
        max_length=200, required=False, help_text="Or route to a new, empty queue of this name."
    )

    class Meta:
        model = TriageRule
        fields = ["name", "queue", *CONDITION_FIELDS, "sample_rate", "enabled"]
        labels = {"min_tool_calls": "More tool calls than", "text": "Text contains"}
        help_texts = {
            "failed_tool": f"A call of this tool returned an error; {ANY_TOOL} for any tool.",
            "sample_rate": "Share of matching traces routed (0 to 1); the same ones on every run.",
        }

    def __init__(self, *args, project, **kwargs):
        super().__init__(*args, **kwargs)
        self.instance.project = project
        self.fields["queue"].required = False
        self.fields["queue"].queryset = Queue.objects.filter(project=project).order_by("name")
        self.fields["tag"].queryset = Tag.objects.filter(project=project).order_by("name")

    def clean_sample_rate(self) -> float:
        rate = self.cleaned_data["sample_rate"]
        if not 0 < rate <= 1:
            raise forms.ValidationError("a sample rate is above 0 and at most 1")
        return rate

    def clean(self) -> dict:
        data = super().clean()
        if bool(data.get("queue")) == bool(data.get("new_queue")):
            self.add_error("queue", "choose a queue or name a new one (not both)")
        if not any(data.get(name) not in (None, "") for name in CONDITION_FIELDS):
            raise forms.ValidationError("a rule needs at least one condition")
        return data


class ApplyFeedbackForm(forms.Form):
    """One of this trace's feedback, and the similar traces the reviewer ticked."""

    feedback = forms.ModelChoiceField(queryset=Feedback.objects.none())
    traces = forms.ModelMultipleChoiceField(
        queryset=Trace.objects.none(), error_messages={"required": "tick the traces it fits"}
    )

    def __init__(self, *args, trace: Trace, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["feedback"].queryset = trace.feedback.order_by("id")
        self.fields["traces"].queryset = Trace.objects.filter(project=trace.project_id).exclude(
            pk=trace.pk
        )


class MonitorForm(TraceFilterForm):
    bucket = forms.ChoiceField(
        choices=[("day", "per day"), ("hour", "per hour")], required=False, label="Over time"
    )
