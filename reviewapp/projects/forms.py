"""The projects wing's HTML forms: members, their roles and invitations, the project's settings."""

from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from django import forms
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from reviewapp.projects.models import Project, Role
from reviewapp.projects.project_settings import ProjectSettings, is_overrides


class AddMemberForm(forms.Form):
    """An existing user, by username, and the role they get in the project."""

    username = forms.CharField(max_length=150)
    role = forms.ChoiceField(choices=Role.choices, initial=Role.REVIEWER)


class MemberRoleForm(forms.Form):
    role = forms.ChoiceField(choices=Role.choices)


class InviteForm(forms.Form):
    """Who the invitation is for (shown in the list; the link itself joins whoever opens it)."""

    invitee = forms.CharField(max_length=254, label="E-mail or username")
    role = forms.ChoiceField(choices=Role.choices, initial=Role.REVIEWER)


class ProjectForm(forms.Form):
    """The project's name and the model name its harness asks the gateway for."""

    name = forms.CharField(max_length=Project._meta.get_field("name").max_length)
    served_model = forms.CharField(
        max_length=Project._meta.get_field("served_model").max_length,
        label="Served model",
        help_text="the model name the harness asks the gateway for",
    )


def _kinds(annotation: Any) -> set:
    """The types an annotation allows, unions and Annotated unwrapped (`int | None`: int, None)."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _kinds(get_args(annotation)[0])
    if origin in (Union, UnionType):
        return set().union(*(_kinds(arg) for arg in get_args(annotation)))
    if origin is Literal:
        return {("literal", value) for value in get_args(annotation)}
    return {origin or annotation}


def _form_field(info: FieldInfo, *, overrides: bool) -> forms.Field:
    """A form field for one setting; in an overrides section blank means the library's default."""
    kinds = _kinds(info.annotation)
    default = info.get_default(call_default_factory=True)
    if default is None:
        shown_default = "automatic"  # the library picks it (per mode, or per device)
    elif isinstance(default, tuple | list):
        shown_default = ", ".join(default)
    else:
        shown_default = default
    help_text = f"default: {shown_default}" if overrides else ""
    literals = [value for kind in kinds if isinstance(kind, tuple) for value in [kind[1]]]
    if tuple in kinds or list in kinds:
        return forms.CharField(
            required=False,
            widget=forms.Textarea(attrs={"rows": 3}),
            help_text=help_text or "one per line",
        )
    if literals and not kinds - {("literal", value) for value in literals}:
        choices = [(value, value) for value in literals]
        blank = [("", f"default ({shown_default})")] if overrides else []
        return forms.ChoiceField(choices=blank + choices, required=not overrides)
    if bool in kinds:
        if overrides or type(None) in kinds:
            choices = [("", f"default ({shown_default})"), ("true", "yes"), ("false", "no")]
            return forms.TypedChoiceField(
                choices=choices, coerce=lambda value: value == "true", required=False
            )
        return forms.BooleanField(required=False)
    required = not overrides and type(None) not in kinds
    if int in kinds:
        return forms.IntegerField(required=required, help_text=help_text)
    if float in kinds:
        return forms.FloatField(required=required, help_text=help_text)
    return forms.CharField(required=False, help_text=help_text)


def _as_list(text: str, info: FieldInfo) -> Any:
    """A textarea's lines as a list; a lone line that is one of the field's literals stays text
    (`target_modules`: "all-linear" or module names)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    literals = {kind[1] for kind in _kinds(info.annotation) if isinstance(kind, tuple)}
    return lines[0] if len(lines) == 1 and lines[0] in literals else lines


SECTION_TITLES = {
    "training": "Training",
    "gate": "Evaluation gate",
    "data_policy": "Data policy",
    "teacher": "Teacher",
    "general": "Approval and deploy",
}


def _section_of(info: FieldInfo) -> type[BaseModel] | None:
    section = info.annotation
    return section if isinstance(section, type) and issubclass(section, BaseModel) else None


class ProjectSettingsForm(forms.Form):
    """Every field of the settings schema, named `section.field` (or `field` at the top), so a
    problem the schema reports at a location lands beside the input of that name. Only typing is
    checked here; bounds, cross-field rules and what the operator allows are the schema's."""

    def __init__(self, *args, stored: dict, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.stored = stored if isinstance(stored, dict) else {}
        self.sections: list[tuple[str, list[str]]] = []  # (title, field names), page order
        top_level = []
        for name, info in ProjectSettings.model_fields.items():
            section = _section_of(info)
            if section is None:
                self.fields[name] = _form_field(info, overrides=False)
                top_level.append(name)
                continue
            names = []
            for field, field_info in section.model_fields.items():
                overrides = is_overrides(section)
                self.fields[f"{name}.{field}"] = _form_field(field_info, overrides=overrides)
                names.append(f"{name}.{field}")
            self.sections.append((name, names))
        self.sections.append(("general", top_level))
        self.initial = {**_initial(self.stored), **self.initial}

    def changed_sections(self) -> dict[str, Any]:
        """The sections the form changes, whole, for update_settings: one left as it was is not
        sent, so an address the operator has since withdrawn does not block the others."""
        stored = {**ProjectSettings().model_dump(mode="json"), **self.stored}
        return {
            name: value for name, value in self._sections().items() if value != stored.get(name)
        }

    def _sections(self) -> dict[str, Any]:
        sections: dict[str, Any] = {}
        for name, info in ProjectSettings.model_fields.items():
            section = _section_of(info)
            if section is None:
                sections[name] = self._value(name, info)
                continue
            values = {}
            for field, field_info in section.model_fields.items():
                value = self._value(f"{name}.{field}", field_info)
                if not (is_overrides(section) and value in (None, "", [])):
                    values[field] = value
            sections[name] = values
        return sections

    def _value(self, name: str, info: FieldInfo) -> Any:
        value = self.cleaned_data.get(name)
        if isinstance(self.fields[name].widget, forms.Textarea):
            return _as_list(value or "", info)
        return value

    def add_problems(self, problems: list[tuple[str, str]]) -> None:
        """Each (`section.field.index`, message) beside the longest field name it starts with."""
        for location, message in problems:
            parts = location.split(".")
            while parts and ".".join(parts) not in self.fields:
                parts.pop()
            self.add_error(".".join(parts) or None, message)


def _initial(stored: dict) -> dict[str, Any]:
    """The stored settings as the form's values: an overrides section shows what is set,
    blank elsewhere; other fields show what is stored, else the schema's default."""
    defaults = ProjectSettings().model_dump(mode="json")
    initial = {}
    for name, info in ProjectSettings.model_fields.items():
        value = stored.get(name, defaults[name])
        section = _section_of(info)
        if section is None:
            initial[name] = _shown(value, as_choice=False)
            continue
        for field in section.model_fields:
            field_value = value.get(field) if isinstance(value, dict) else None
            initial[f"{name}.{field}"] = _shown(field_value, as_choice=is_overrides(section))
    return initial


def _shown(value: Any, *, as_choice: bool) -> Any:
    """A stored value as its input shows it: lines for a list, "true"/"false" for a choice."""
    if isinstance(value, list):
        return "\n".join(str(item) for item in value)
    if isinstance(value, bool) and as_choice:
        return "true" if value else "false"
    return "" if value is None else value
