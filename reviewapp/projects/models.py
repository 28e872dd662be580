"""A project (a tenant), its API keys, its members' roles and invitations to join it."""

import hashlib
import secrets
from datetime import datetime, timedelta

from django.conf import settings
from django.db import models
from django.utils import timezone


class Project(models.Model):
    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    # The model the adapters are trained from (a registry name or an HF model directory).
    base_model = models.CharField(max_length=300, default="SmolLM2-135M-Instruct")
    # The model name the harness asks the gateway for; resolved to the base or an adapter.
    served_model = models.CharField(max_length=200, default="SmolLM2-135M-Instruct")
    # The OpenAI-compatible server the gateway forwards to; blank: the configured default.
    upstream_url = models.URLField(max_length=500, blank=True)
    # The name the upstream serves the base model under; blank: the same as served_model.
    upstream_model = models.CharField(max_length=200, blank=True)
    # Training policy and other per-project knobs, validated where they are used.
    settings = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return self.slug


class KeyScope(models.TextChoices):
    """What an API key may do; a route needs one of the scopes it names (docs/reliability.md)."""

    INGEST = "ingest", "ingest: the gateway, traces, outcomes and end-user feedback"
    REVIEW = "review", "review: feedback whose corrections are approved targets, new tags, alerts"
    ADMIN = "admin", "admin: retrain, runs, adapters and export"


def default_key_scopes() -> list[str]:
    """A key made without naming scopes does what a harness needs and cannot change the model."""
    return [KeyScope.INGEST.value]


class ApiKey(models.Model):
    """A machine credential for one project. Only a hash of the secret is stored."""

    PREFIX_LENGTH = 12

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=PREFIX_LENGTH)  # shown in lists to tell keys apart
    secret_hash = models.CharField(max_length=64, unique=True)  # serves: lookup on every request
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    scopes = models.JSONField(default=default_key_scopes)  # KeyScope values

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.project.slug})"

    def has_scope(self, scope: str) -> bool:
        return scope in self.scopes

    @staticmethod
    def new_secret() -> str:
        return "apk_" + secrets.token_urlsafe(32)

    @staticmethod
    def hash_secret(secret: str) -> str:
        # The secret has 256 bits of entropy, so a fast hash is enough (no password stretching).
        return hashlib.sha256(secret.encode()).hexdigest()

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class Role(models.TextChoices):
    ADMIN = "admin"  # manages keys, taxonomy, queues and members
    REVIEWER = "reviewer"  # tags, writes feedback, works queues
    VIEWER = "viewer"  # reads


class Membership(models.Model):
    """A person's role in one project; every dashboard view is scoped through it."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.REVIEWER)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "user"], name="membership_once"),
        ]

    def __str__(self) -> str:
        return f"{self.user} is {self.role} of {self.project}"

    @property
    def can_review(self) -> bool:
        return self.role in (Role.ADMIN, Role.REVIEWER)

    @property
    def is_admin(self) -> bool:
        return self.role == Role.ADMIN


class Invitation(models.Model):
    """A one-time link that joins whoever opens it to a project in a role; only a hash of its
    token is stored, and it is open until it is accepted, revoked or past `expires_at`."""

    LIFETIME = timedelta(days=7)

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="invitations")
    invitee = models.CharField(max_length=254)  # the e-mail or username it was made for
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.REVIEWER)
    token_hash = models.CharField(max_length=64, unique=True)  # serves: opening the link
    invited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    accepted_at = models.DateTimeField(null=True, blank=True)
    accepted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.invitee} to {self.project} as {self.role}"

    @staticmethod
    def new_token() -> str:
        return secrets.token_urlsafe(32)

    @staticmethod
    def hash_token(token: str) -> str:
        # 256 bits of entropy, as an API key's secret: a fast hash is enough.
        return hashlib.sha256(token.encode()).hexdigest()

    def closed_because(self, now: datetime) -> str:
        """Why the link no longer works, or "" while it is open."""
        if self.accepted_at is not None:
            return "it has already been used"
        if self.revoked_at is not None:
            return "an admin of the project revoked it"
        if self.expires_at <= now:
            return "it has expired"
        return ""
