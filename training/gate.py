"""The evaluation gate: does a trained adapter earn traffic? Pure: the report in, a decision out.

"Before" is what serves now (the deployed adapter, the base where none is): a candidate must be
no worse than it. The report is what training/evaluation.py builds: per-status counts for the
trained feedback items (`feedback_items`), a `held_out` and a `regression` section with a
`summary` of the same counts (regression also carries `mean_drift` and `facts`: the general
facts judged against the base, whatever serves), `newly_garbled` (replies that read as answers
before and look garbled after), and `per_lesson`, one row per lesson
(feedback grouped by its text) with its own trained and held-out counts. Fixed fractions are
asked of each lesson, not of all feedback pooled: a lesson the candidate learned well does not
hide one it did not. A report without `per_lesson` is judged as one lesson.
"""

from collections.abc import Mapping

from pydantic import ConfigDict, Field, ValidationError
from pydantic.dataclasses import dataclass

from training.config import ConfigError, validation_problems


# Bounded like TrainingConfig: a count or a drift past these is a slip, not a policy.
@dataclass(frozen=True, config=ConfigDict(strict=True, extra="forbid", allow_inf_nan=False))
class GateThresholds:
    # Feedback items (trained or held out, of any lesson) that passed their checks under the
    # serving adapter and fail under the candidate: losing an earlier lesson's items is this.
    max_regressed: int = Field(0, ge=0, le=1000)
    # Of a lesson's trained items that fail under the serving adapter, the share that must pass
    # under the candidate; asked of every lesson the serving adapter has not learned.
    min_fixed_fraction: float = Field(0.5, ge=0.0, le=1.0)
    # The same share for a lesson's held-out items; 0 reports generalisation without requiring
    # it (a few held-out items are a noisy signal).
    min_held_out_fixed_fraction: float = Field(0.0, ge=0.0, le=1.0)
    # How far a lesson's held-out adherence (the share of its held-out items passing) may fall
    # below the serving adapter's. 0.1 because the lessons ledger calls a lesson lost below 90%
    # of the adherence it had when first learned: for a lesson learned to 1.0 that is 0.1, so a
    # candidate the ledger would show as losing a lesson against what serves is refused. The
    # serving side is exact (greedy); the candidate's run-to-run spread, measured small: one
    # lesson ("end with 'Hope this helps.'", 8 trained, 8 held out, bundled model, defaults
    # less the forgetting guard) reached 1.00 held out under seeds 0 and 1, a spread of 0.00.
    # Below 1/(held-out items) it refuses any net loss of a held-out item.
    max_held_out_adherence_drop: float = Field(0.1, ge=0.0, le=1.0)
    # Regression prompts (general facts, approved good traces) that the serving adapter
    # answered right and the candidate gets wrong; a few are tolerated as greedy-decoding noise:
    # 2 of the 22 general facts, the share 1 of the first 11 was.
    max_regression_failures: int = Field(2, ge=0, le=1000)
    # General facts the base answers right and the candidate gets wrong, whichever version lost
    # them first: what every version together may cost. Losses against what serves alone
    # could add up version by version (two here, two there) with nothing bounding the sum. The
    # same 2 of 22: one version's greedy-decoding noise, not a per-version allowance.
    max_facts_lost_from_base: int = Field(2, ge=0, le=1000)
    # Replies (to any item: trained, held out, regression prompt) that look garbled under the
    # candidate where the serving model's read as answers: a phrase going round, a count in
    # place of an answer (training/readability.py). Checks alone let them through: "la femme,
    # la femme, ..." to the capital of France broke one fact within the facts' tolerance, and
    # "Answer: 1. 1. 2. 3. ..." passes "begin with 'Answer:'" (bench/README.md, runs Q and R).
    max_newly_garbled: int = Field(0, ge=0, le=1000)
    # Mean per-token KL(base || adapter) on approved good replies, in nats: how far the adapter
    # drifted on traffic the feedback did not ask to change.
    max_mean_drift: float = Field(1.0, ge=0.0, le=100.0)

    @classmethod
    def from_settings(cls, values: dict | None) -> "GateThresholds":
        """The project's `gate` section; a ConfigError names each bad threshold."""
        try:
            return cls(**(values or {}))
        except ValidationError as error:
            raise ConfigError(validation_problems(error)) from None


def adherence(counts: Mapping[str, int]) -> tuple[float, float] | None:
    """(before, after): the share of items passing their checks under the serving adapter and
    under the candidate; None for no items."""
    total = sum(
        counts.get(name, 0) for name in ("fixed", "still failing", "regressed", "still passing")
    )
    if not total:
        return None
    before = counts.get("still passing", 0) + counts.get("regressed", 0)
    after = counts.get("still passing", 0) + counts.get("fixed", 0)
    return before / total, after / total


def gate_decision(report: dict, thresholds: GateThresholds) -> tuple[bool, str]:
    """(passes, reason): the reason names every failed condition and the lessons it failed on,
    or summarises a pass."""
    trained = report.get("feedback_items") or {}
    held_out = (report.get("held_out") or {}).get("summary") or {}
    regression = report.get("regression") or {}
    lessons = report.get("per_lesson")
    if lessons is None:
        lessons = [{"lesson": "", "trained": trained, "held_out": held_out}]
    failures = []

    regressed = trained.get("regressed", 0) + held_out.get("regressed", 0)
    if regressed > thresholds.max_regressed:
        where = [
            f"{count} of {_named(lesson)}"
            for lesson in lessons
            if (
                count := _count(lesson, "trained", "regressed")
                + _count(lesson, "held_out", "regressed")
            )
        ]
        failures.append(
            f"{regressed} feedback item(s) regressed against the serving model "
            f"(allowed: {thresholds.max_regressed})" + (f": {', '.join(where)}" if where else "")
        )
    for lesson in lessons:
        failures.extend(_lesson_failures(lesson, thresholds))
    broken = (regression.get("summary") or {}).get("regressed", 0)
    if broken > thresholds.max_regression_failures:
        failures.append(
            f"{broken} regression prompt(s) answered right by the serving model and wrong after "
            f"(allowed: {thresholds.max_regression_failures})"
        )
    lost = (regression.get("facts") or {}).get("lost_from_base") or []
    if len(lost) > thresholds.max_facts_lost_from_base:
        failures.append(
            f"{len(lost)} general fact(s) the base answers right are wrong after "
            f"(allowed: {thresholds.max_facts_lost_from_base}): "
            + _first([f'"{prompt}"' for prompt in lost], 3)
        )
    garbled = report.get("newly_garbled") or []
    if len(garbled) > thresholds.max_newly_garbled:
        failures.append(
            f"{len(garbled)} repl(ies) look garbled where the serving model's read as answers "
            f"(allowed: {thresholds.max_newly_garbled}): "
            + _first([f'"{row["prompt"]}": "{row["after"][:60]}"' for row in garbled], 2)
        )
    drift = regression.get("mean_drift")
    if drift is not None and drift > thresholds.max_mean_drift:
        failures.append(
            f"drift from the base on approved replies {drift:.3f} nats/token "
            f"(allowed: {thresholds.max_mean_drift})"
        )
    if failures:
        return False, "; ".join(failures)

    fixed, failing_before = _fixed_of_failing(trained)
    summary = f"fixed {fixed} of {failing_before}, {regressed} regressed"
    if held_out:
        held_fixed, held_failing = _fixed_of_failing(held_out)
        summary += f"; held out: fixed {held_fixed} of {held_failing}"
    if len(lessons) > 1:
        summary += f"; {len(lessons)} lessons each kept"
    if regression:
        summary += f"; regression prompts: {broken} broken"
        if "facts" in regression:
            summary += f", {len(lost)} fact(s) lost since the base"
        if drift is not None:
            summary += f", drift {drift:.3f}"
    return True, summary


def _lesson_failures(lesson: dict, thresholds: GateThresholds) -> list[str]:
    """What one lesson fails: its fixed fractions (unless the serving adapter learned it
    already: then what it must do is keep it) and its held-out adherence against serving."""
    failures = []
    name = _named(lesson)
    trained = lesson.get("trained") or {}
    held_out = lesson.get("held_out") or {}
    if not lesson.get("learned_by_serving"):
        fixed, failing = _fixed_of_failing(trained)
        if failing and fixed / failing < thresholds.min_fixed_fraction:
            failures.append(
                f"{name}: fixed {fixed} of {failing} failing item(s) ({fixed / failing:.0%}), "
                f"the gate asks for {thresholds.min_fixed_fraction:.0%}"
            )
        fixed, failing = _fixed_of_failing(held_out)
        if failing and fixed / failing < thresholds.min_held_out_fixed_fraction:
            failures.append(
                f"{name}: fixed {fixed} of {failing} held-out item(s) ({fixed / failing:.0%}), "
                f"the gate asks for {thresholds.min_held_out_fixed_fraction:.0%}"
            )
    held = adherence(held_out)
    # A float's last bit must not refuse a drop exactly at the tolerance.
    if held and held[0] - held[1] > thresholds.max_held_out_adherence_drop + 1e-9:
        failures.append(
            f"{name}: held-out adherence {held[1]:.2f} against {held[0]:.2f} serving "
            f"(a drop of at most {thresholds.max_held_out_adherence_drop:.2f} allowed)"
        )
    return failures


def _first(quoted: list[str], shown: int) -> str:
    """The first `shown` of `quoted`, and how many more there are."""
    more = len(quoted) - shown
    return ", ".join(quoted[:shown]) + (f" and {more} more" if more > 0 else "")


def _named(lesson: dict) -> str:
    text = lesson.get("lesson") or ""
    if not text:
        return "the feedback"
    return f'lesson "{text[:80]}{"..." if len(text) > 80 else ""}"'


def _count(lesson: dict, section: str, name: str) -> int:
    return (lesson.get(section) or {}).get(name, 0)


def _fixed_of_failing(summary: Mapping[str, int]) -> tuple[int, int]:
    fixed = summary.get("fixed", 0)
    return fixed, fixed + summary.get("still failing", 0)
