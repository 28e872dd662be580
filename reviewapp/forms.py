"""HTML forms of the dashboard (the JSON API validates with pydantic schemas instead)."""

import json

from django import forms

from reviewapp.rendering import TurnView
from reviewapp.services.feedback import MAX_FEEDBACK_TEXT_LENGTH
from reviewapp.services.targets import AUTO_APPROVE_POLICIES


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

    def __init__(self, *args, turns: list[TurnView], **kwargs):
        super().__init__(*args, **kwargs)
        choices = [("trace", "the whole trace")]
        for turn in turns:
            if turn.role != "assistant":
                continue
            choices.append((f"turn:{turn.index}", f"turn {turn.index} (assistant)"))
            for call in turn.tool_calls:
                choices.append((f"call:{call.id}", f"tool call {call.name} ({call.id})"))
        self.fields["anchor"].choices = choices

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
        return data

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
        checks = [
            {"kind": kind_name, "value": data[f"check_{kind_name}"]}
            for kind_name in ("regex", "not_regex", "max_words", "calls_tool")
            if data[f"check_{kind_name}"] not in (None, "")
        ]
        return {
            "text": data["text"],
            "turn": int(value) if kind == "turn" else None,
            "tool_call_id": value if kind == "call" else None,
            "rating": data["rating"],
            "correction": correction,
            "checks": checks,
        }


class AutoApproveForm(forms.Form):
    policy = forms.ChoiceField(label="Auto-approve", choices=AUTO_APPROVE_POLICIES.items())
    apply_to_proposed = forms.BooleanField(
        label="also approve the proposed targets that pass now", required=False
    )
