"""A fixed set of small questions, each answerable with one tool, each with its own checker."""

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

# A checker sees the final answer and the time the environment's clock reported.
Checker = Callable[[str, datetime], bool]

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


@dataclass(frozen=True)
class Task:
    task_id: str
    question: str
    tool: str  # the tool the agent is made to call (named tool_choice)
    check: Checker

    def is_correct(self, answer: str, *, now: datetime) -> bool:
        return self.check(answer, now)


def numbers_in(text: str) -> list[float]:
    """Every number written in the text; thousands separators are ignored."""
    return [float(match) for match in _NUMBER.findall(re.sub(r"(?<=\d),(?=\d{3})", "", text))]


def _number(expected: float) -> Checker:
    def check(answer: str, now: datetime) -> bool:
        return any(abs(found - expected) < 1e-6 for found in numbers_in(answer))

    return check


def _phrase(*any_of: str) -> Checker:
    """Any of the phrases as whole words, so "no" does not match "know"."""
    pattern = re.compile("|".join(rf"\b{re.escape(phrase)}\b" for phrase in any_of), re.I)

    def check(answer: str, now: datetime) -> bool:
        return pattern.search(answer) is not None

    return check


def _clock_field(strftime_format: str) -> Checker:
    def check(answer: str, now: datetime) -> bool:
        return now.strftime(strftime_format).lower() in answer.lower()

    return check


def _arithmetic(task_id: str, question: str, expected: float) -> Task:
    return Task(task_id, question, "calculator", _number(expected))


def _handbook(task_id: str, question: str, *any_of: str) -> Task:
    return Task(task_id, question, "lookup", _phrase(*any_of))


def _time(task_id: str, question: str, strftime_format: str) -> Task:
    return Task(task_id, question, "clock", _clock_field(strftime_format))


TASKS: tuple[Task, ...] = (
    _arithmetic("calc-multiply", "What is 12 times 7?", 84),
    _arithmetic("calc-add", "What is 347 plus 589?", 936),
    _arithmetic("calc-subtract", "What is 1000 minus 273?", 727),
    _arithmetic("calc-divide", "What is 156 divided by 12?", 13),
    _arithmetic("calc-power", "What is 2 to the power of 10?", 1024),
    _arithmetic("calc-parentheses", "What is (15 + 5) * 3?", 60),
    _arithmetic("calc-modulo", "What is the remainder of 100 divided by 7?", 2),
    _arithmetic("calc-negative", "What is 25 minus 40?", -15),
    _arithmetic("calc-decimal", "What is 7.5 times 4?", 30),
    _arithmetic("calc-order", "What is 2 + 3 * 4?", 14),
    _arithmetic("calc-percent", "What is 15 percent of 80?", 12),
    _arithmetic("calc-average", "What is the average of 10, 20 and 60?", 30),
    _handbook("docs-refund-window", "How many days do I have to ask for a refund?", "30"),
    _handbook("docs-refund-delay", "How long does a refund take to arrive?", "5 to 7", "5-7"),
    _handbook("docs-shipping-standard", "How long does standard shipping take?", "3 to 5", "3-5"),
    _handbook("docs-shipping-free", "Above what order total is shipping free?", "50"),
    _handbook("docs-shipping-express", "How much does express shipping cost?", "15"),
    _handbook("docs-support-open", "What time does support open?", "9:00", "9 am", "9am"),
    _handbook("docs-support-weekend", "How can I reach support at weekends?", "email"),
    _handbook(
        "docs-warranty", "How long is the warranty on devices?", "2-year", "2 years", "24 months"
    ),
    _handbook("docs-warranty-damage", "Is accidental damage covered by the warranty?", "no", "not"),
    _handbook("docs-returns", "In what condition must a returned item be?", "unused"),
    _handbook("docs-payment", "How long does a bank transfer take to clear?", "3", "three"),
    _time("time-year", "What year is it right now?", "%Y"),
    _time("time-weekday", "What day of the week is it today?", "%A"),
    _time("time-month", "Which month is it now?", "%B"),
    _time("time-date", "What is today's date (in UTC)?", "%Y-%m-%d"),
)
TASKS_BY_ID: dict[str, Task] = {task.task_id: task for task in TASKS}
