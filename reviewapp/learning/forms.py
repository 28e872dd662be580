"""The learning wing's HTML forms: the approval policy, Retrain."""

from typing import get_args

from django import forms

from reviewapp.learning.approvals import AUTO_APPROVE_POLICIES
from reviewapp.projects.project_settings import AUTO_APPROVE_CHOICES
from training.config import TrainingMode


class AutoApproveForm(forms.Form):
    policy = forms.ChoiceField(
        label="Auto-approve",
        choices=[(policy, AUTO_APPROVE_POLICIES[policy]) for policy in AUTO_APPROVE_CHOICES],
    )
    apply_to_proposed = forms.BooleanField(
        label="also approve the proposed targets that pass now", required=False
    )


# What each of TrainingConfig's modes does, in the Retrain form's words.
TRAINING_MODE_DESCRIPTIONS = {
    "sft": "learn the approved targets",
    "distill": "on-policy self-distillation",
}


class RetrainForm(forms.Form):
    mode = forms.ChoiceField(
        choices=[
            (mode, f"{mode}: {TRAINING_MODE_DESCRIPTIONS[mode]}") for mode in get_args(TrainingMode)
        ]
    )
