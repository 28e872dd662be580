"""Reads about feedback the model could not use, for the pages that report it."""

from dataclasses import dataclass

from reviewapp.projects.models import Project
from reviewapp.review.models import Feedback, FeedbackStatus

# The Retrain page names the newest few; each trace page shows its own in full.
MAX_EXAMPLES_SHOWN = 3


@dataclass(frozen=True)
class UnusableFeedback:
    count: int
    # The newest failed feedback items (their trace_id and failure_reason), to link and name.
    examples: list[Feedback]

    def __bool__(self) -> bool:
        return self.count > 0


def unusable_feedback(*, project: Project) -> UnusableFeedback:
    """How many of the project's feedback items failed, and the newest few with their reasons."""
    failed = Feedback.objects.filter(trace__project=project, status=FeedbackStatus.FAILED)
    examples = failed.only("id", "trace_id", "failure_reason").order_by("-id")[:MAX_EXAMPLES_SHOWN]
    return UnusableFeedback(count=failed.count(), examples=list(examples))
