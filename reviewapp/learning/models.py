"""The learning loop's data: distillation targets, training runs, adapters and the model route.

Part of the `reviewapp` Django app (same app label, same tables); the rest of the loop lives
beside it in this package: runs.py (the run state machine), retrain.py, tasks.py, deploy.py.
"""

from django.conf import settings
from django.db import models
from django.utils import timezone


class TargetState(models.TextChoices):
    PROPOSED = "proposed"
    APPROVED = "approved"
    EDITED = "edited"  # approved after a reviewer changed the text
    REJECTED = "rejected"


class DistillationTarget(models.Model):
    """What the model should have said at one turn: a teacher revision or a correction."""

    # PROTECT: a target a run trained on is the adapter's lineage; deleting feedback that has
    # targets goes through services.feedback.delete_feedback, which dismisses it instead.
    feedback = models.ForeignKey(
        "reviewapp.Feedback", on_delete=models.PROTECT, related_name="targets"
    )
    turn = models.IntegerField()  # the assistant turn the target replaces
    # "hint" / "rewrite": sampled by the teacher under that prompt; "correction": a reviewer's.
    source = models.CharField(max_length=16)
    student_context = models.JSONField()  # the messages the model saw before the turn
    teacher_context = models.JSONField(null=True, blank=True)
    original = models.JSONField(null=True, blank=True)  # the assistant turn as it was
    target = models.JSONField()  # the assistant message to learn
    passes_checks = models.BooleanField(default=True)
    state = models.CharField(
        max_length=16, choices=TargetState.choices, default=TargetState.PROPOSED
    )
    reviewed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        # serves: "what is approved in this project" for Retrain
        indexes = [models.Index(fields=["state", "feedback"], name="target_state")]

    def __str__(self) -> str:
        return f"{self.source} target for feedback {self.feedback_id} ({self.state})"


class RunStatus(models.TextChoices):
    QUEUED = "queued"
    BUILDING = "building"
    TRAINING = "training"
    EVALUATING = "evaluating"
    DEPLOYING = "deploying"
    DEPLOYED = "deployed"
    TRAINED = "trained"  # finished without a deploy (gate off or not asked for)
    GATE_FAILED = "gate_failed"
    DEPLOY_FAILED = "deploy_failed"
    FAILED = "failed"
    CANCELLED = "cancelled"


ACTIVE_RUN_STATUSES = (
    RunStatus.QUEUED,
    RunStatus.BUILDING,
    RunStatus.TRAINING,
    RunStatus.EVALUATING,
    RunStatus.DEPLOYING,
)


class TrainingRun(models.Model):
    project = models.ForeignKey("reviewapp.Project", on_delete=models.CASCADE, related_name="runs")
    mode = models.CharField(max_length=16, default="sft")
    config = models.JSONField()  # TrainingConfig.to_json(), frozen when the run is created
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.QUEUED)
    # {"step", "total_steps", "loss", "tokens_per_s", "eta_s"}, written as training goes.
    progress = models.JSONField(default=dict, blank=True)
    loss_curve = models.JSONField(default=list, blank=True)
    metrics = models.JSONField(default=dict, blank=True)  # evaluation results
    log = models.TextField(blank=True)
    error = models.TextField(blank=True)
    targets = models.ManyToManyField(DistillationTarget, blank=True, related_name="runs")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # The worker that claimed the run and when it last reported; a stale heartbeat on an
    # active run means its worker died, and the run is failed rather than left running.
    worker = models.CharField(max_length=200, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    cancel_requested = models.BooleanField(default=False)
    # What the run learns from and is judged on, fixed when it is created (learning/runs.py):
    # {"train_target_ids", "held_out_feedback_ids", "replay": {...}, "regression": {...}}.
    data_split = models.JSONField(default=dict, blank=True)
    # What its evaluation, gate and deploy use, fixed when it is created (learning/plan.py):
    # {"gate": {thresholds}, "auto_deploy", "canary_share", "deploy_quorum", "upstreams"}.
    # Empty on runs created before it existed.
    plan = models.JSONField(default=dict, blank=True)
    # Deliveries of the run's task that claimed it; a redelivered run resumes from its last
    # checkpoint, and one that keeps killing its worker fails after MAX_RUN_ATTEMPTS.
    attempts = models.PositiveSmallIntegerField(default=0)

    class Meta:
        indexes = [models.Index(fields=["project", "-created_at"], name="run_project_recent")]

    def __str__(self) -> str:
        return f"run {self.pk} ({self.status})"

    @property
    def is_active(self) -> bool:
        return self.status in ACTIVE_RUN_STATUSES


class Adapter(models.Model):
    """An immutable, versioned LoRA adapter: `<project>-v<N>` in a directory of its own."""

    project = models.ForeignKey(
        "reviewapp.Project", on_delete=models.CASCADE, related_name="adapters"
    )
    version = models.PositiveIntegerField()
    name = models.CharField(max_length=200, unique=True)
    path = models.CharField(max_length=1000)
    base_model = models.CharField(max_length=300)
    checksum = models.CharField(max_length=64)
    run = models.OneToOneField(
        TrainingRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="adapter"
    )
    eval_results = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "version"], name="adapter_version"),
        ]

    def __str__(self) -> str:
        return self.name


class ModelRoute(models.Model):
    """Where the gateway sends a project's served model name: the base or an adapter version."""

    project = models.OneToOneField(
        "reviewapp.Project", on_delete=models.CASCADE, related_name="route"
    )
    # Upstream model names; blank means the base model.
    primary = models.CharField(max_length=200, blank=True)
    canary = models.CharField(max_length=200, blank=True)
    canary_share = models.PositiveSmallIntegerField(default=0)  # percent of calls to `canary`
    previous_primary = models.CharField(max_length=200, blank=True)  # what rollback restores
    # Bumped by every change (learning/deploy.py): a deploy that loaded while the route moved
    # sees a different revision under the lock and is refused.
    revision = models.PositiveIntegerField(default=0)
    updated_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.project.slug}: {self.primary or 'base'} + {self.canary_share}% {self.canary}"


class Lesson(models.Model):
    """One lesson of a project's ledger: feedback grouped by its text (compared without case
    or spacing), written when a run's evaluation is recorded (learning/lessons.py)."""

    project = models.ForeignKey(
        "reviewapp.Project", on_delete=models.CASCADE, related_name="lessons"
    )
    # sha256 of the grouping key (training.eval_sets.feedback_kind): a feedback text can be
    # longer than a unique index entry may be.
    key = models.CharField(max_length=64)
    text = models.TextField()  # as first seen, its spacing normalised
    checks = models.JSONField(default=list, blank=True)  # the checks its items are judged by
    # The first version trained on it that passed the gate, and its adherence there: what
    # "lost" is measured against.
    first_learned_by = models.ForeignKey(
        Adapter, null=True, blank=True, on_delete=models.SET_NULL, related_name="lessons_learned"
    )
    first_learned_adherence = models.FloatField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        # serves: the ledger's upsert of a run's lessons, and the project's ledger page
        constraints = [models.UniqueConstraint(fields=["project", "key"], name="lesson_key")]

    def __str__(self) -> str:
        return self.text[:80]


class LessonAdherence(models.Model):
    """How well one adapter version follows one lesson: the share of its items that pass."""

    lesson = models.ForeignKey(Lesson, on_delete=models.CASCADE, related_name="adherence")
    adapter = models.ForeignKey(Adapter, on_delete=models.CASCADE, related_name="lesson_adherence")
    held_out = models.FloatField(null=True, blank=True)  # None: no item of it was held out
    trained = models.FloatField(null=True, blank=True)  # None: every item was held out
    held_out_items = models.PositiveIntegerField(default=0)
    trained_items = models.PositiveIntegerField(default=0)
    # This version trained on the lesson and passed the gate.
    learned = models.BooleanField(default=False)

    class Meta:
        # serves: one row per (lesson, version), a lesson's history in version order (an
        # adapter page's rows go through the adapter foreign key's own index)
        constraints = [
            models.UniqueConstraint(fields=["lesson", "adapter"], name="lesson_adherence_version")
        ]

    def __str__(self) -> str:
        return f"{self.adapter_id}: {self.adherence}"

    @property
    def adherence(self) -> float | None:
        """Held out where some items were (data it never tuned on), else the trained items."""
        return self.held_out if self.held_out is not None else self.trained
