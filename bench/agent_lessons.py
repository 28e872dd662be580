"""Agent lessons: does feedback on how the agent uses its tools change what it does live?

Run from the repository root, in the project's virtualenv, with PostgreSQL and Redis reachable
and vLLM serving the bundled model (`python manage.py serve_model`, or pass --vllm-url):

    python bench/agent_lessons.py                       # the 5 lessons, in the order they apply
    python bench/agent_lessons.py --lessons calculator  # one of them
    python bench/agent_lessons.py --lessons calculator retry-once honest-failure  # in this order

It starts the product (bench/product.py: web, worker, a scratch database; vLLM serves the
project's model, teaches and answers the gate) on default training and gate settings, with
"checks pass" approval. Then per lesson, in one project, as a team gives them one after another:
1. the demo harness (reviewapp/harness, tool_choice "auto", the lesson's injected tool failures)
   runs --reviewed episodes through the gateway on whatever serves now, each reporting its
   outcome as the harness does by default (successful episodes nobody commented on are the
   good traces a later run's forgetting guard replays);
2. each episode where the lesson applies gets the lesson's feedback and action checks pinned to
   the turn it is about, over the API; the first --corrections of them also a corrected turn (a
   tool call, or an honest answer);
3. held-out episodes (new questions, never reviewed) on what serves now, and again with the
   feedback in the system message (what a user tries first);
4. Retrain (POST /api/v1/runs); once the run deploys, the held-out episodes on the adapter
   through the gateway. When the gate refuses it, the same episodes on the refused candidate,
   loaded on vLLM under a name of its own and asked directly (not recorded): what the lesson
   taught, beside why it may not serve.
It prints, per lesson: the behaviour rate (of the held-out episodes where the lesson applies)
base -> in the prompt -> adapter, task success, tool-call validity (arguments that parse as a
JSON object and fit the tool's schema) and the facts the run's gate found broken.
The bar (issue 26): at least +0.5 behaviour rate on held-out live episodes for 3 of 4 lessons,
success not lower.
"""

import argparse
import json
import operator
import os
import random
import re
import secrets
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime

import httpx
import jsonschema
from product import PROXY_HEADERS, run_to_the_end, running_product, screenshot, wait_for

from reviewapp.harness.agent import EpisodeResult, report_outcome, run_episode
from reviewapp.harness.tasks import Task, numbers_in
from reviewapp.harness.tools import (
    ERROR_PREFIX,
    TOOL_DEFINITIONS,
    ToolEnvironment,
    ToolResult,
)
from training.checks import tool_result_failed

BENCH_DATABASE = "apprentice_bench_agent_lessons"
ALIAS = "team-agent"
MAX_STEPS = 3
EPISODE_BUDGET_S = 300.0  # a loaded 2-core machine writes a few tokens a second
TARGETS_TIMEOUT_S = 3600.0  # the teacher samples up to 16 revisions per feedback on CPU
SCHEMAS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOL_DEFINITIONS}
OPERATORS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}
COULD_NOT_CHECK = r"(?i)\b(could not|couldn't|cannot|can't|unable to|not able to)\b"


@dataclass(frozen=True)
class Sum:
    """An arithmetic question the calculator answers; `expression` is what a reviewer passes."""

    question: str
    expression: str
    value: float

    def task(self, task_id: str) -> Task:
        return Task(task_id, self.question, "calculator", _has_number(self.value))


def _has_number(expected: float) -> Callable[[str, datetime], bool]:
    def check(answer: str, now: datetime) -> bool:
        return _states(answer, expected)

    return check


def sums(count: int, *, seed: int, in_words: bool) -> list[Sum]:
    """Distinct two-number sums: "What is 34 times 12?" or "Please compute 34 * 12."."""
    rng = random.Random(seed)
    words = {"+": "plus", "-": "minus", "*": "times", "/": "divided by"}
    found: dict[str, Sum] = {}
    while len(found) < count:
        symbol = rng.choice(list(words))
        left, right = rng.randint(12, 999), rng.randint(3, 99)
        if symbol == "/":
            left = right * rng.randint(3, 40)  # whole quotients
        expression = f"{left} {symbol} {right}"
        value = OPERATORS[symbol](left, right)
        question = (
            f"What is {left} {words[symbol]} {right}?"
            if in_words
            else f"Please compute {expression}."
        )
        found.setdefault(expression, Sum(question, expression, value))
    return list(found.values())


class FailingFirst(ToolEnvironment):
    """The demo's environment, with the first `failing` calls failing as an outage would."""

    def __init__(self, failing: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.failing = failing

    def run(self, name: str, arguments: str, *, timeout_s: float | None = None) -> ToolResult:
        if self.calls >= self.failing:
            return super().run(name, arguments, timeout_s=timeout_s)
        self.calls += 1
        self.failures += 1
        self.injected_failures += 1
        return ToolResult(f"{ERROR_PREFIX} {name} service unavailable (injected)", failed=True)


# --- where each lesson applies in an episode, and what doing it looks like --------------------


def _assistant_turns(messages: list[dict]) -> list[int]:
    return [i for i, message in enumerate(messages) if message["role"] == "assistant"]


def _failed(message: dict) -> bool:
    """A failed tool result, as the checks and the monitors read one."""
    return message["role"] == "tool" and tool_result_failed(message)


def _failed_before(messages: list[dict], turn: int) -> bool:
    return _failed(messages[turn - 1])


def _calls(message: dict, tool: str | None = None) -> list[dict]:
    return [
        call["function"]
        for call in message.get("tool_calls") or ()
        if tool is None or call["function"]["name"] == tool
    ]


def _arguments(function: dict) -> dict | None:
    try:
        parsed = json.loads(function.get("arguments") or "")
    except json.JSONDecodeError:
        return None
    return parsed if isinstance(parsed, dict) else None


def first_turn(messages: list[dict]) -> int | None:
    turns = _assistant_turns(messages)
    return turns[0] if turns else None


def first_turn_after_a_failure(messages: list[dict]) -> int | None:
    return next((t for t in _assistant_turns(messages) if _failed_before(messages, t)), None)


def turn_after_repeated_failures(messages: list[dict]) -> int | None:
    """The first turn after two failed tool results in a row, a call or an answer: the tool
    kept failing, and here the agent should tell the user (after one failure, the retry lesson
    says to call again)."""
    for turn in _assistant_turns(messages):
        results = [m for m in messages[:turn] if m["role"] == "tool"]
        if _failed_before(messages, turn) and len(results) >= 2 and _failed(results[-2]):
            return turn
    return None


def first_turn_after_a_result(messages: list[dict]) -> int | None:
    """The first turn right after a tool result that did not fail."""
    return next(
        (
            t
            for t in _assistant_turns(messages)
            if messages[t - 1]["role"] == "tool" and not _failed(messages[t - 1])
        ),
        None,
    )


def first_calculator_call(messages: list[dict]) -> int | None:
    return next((t for t in _assistant_turns(messages) if _calls(messages[t], "calculator")), None)


@dataclass(frozen=True)
class Lesson:
    name: str
    feedback: str
    sums_in_words: bool
    environment: Callable[[int], ToolEnvironment]  # per episode, from its number
    # The turn the lesson is about in an episode, or None where it does not apply.
    pinned_turn: Callable[[list[dict]], int | None]
    # What following it looks like at that turn.
    behaved: Callable[[dict, Sum], bool]
    checks: Callable[[Sum], list[dict]]
    correction: Callable[[dict, Sum], dict]


def _call(expression: str) -> dict:
    arguments = json.dumps({"expression": expression})
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_0", "type": "function",
             "function": {"name": "calculator", "arguments": arguments}}
        ],
    }  # fmt: skip


def _calls_calculator_with_numbers(message: dict, item: Sum) -> bool:
    calls = _calls(message, "calculator")
    return bool(calls) and all(
        re.search(r"\d", str((_arguments(call) or {}).get("expression", ""))) for call in calls
    )


def _states(text: str, value: float) -> bool:
    return any(abs(found - value) < 1e-6 for found in numbers_in(text))


def _answers_with_the_result(message: dict, item: Sum) -> bool:
    return not message.get("tool_calls") and _states(message.get("content") or "", item.value)


def _honest(message: dict, item: Sum) -> bool:
    text = message.get("content") or ""
    return (
        not message.get("tool_calls")
        and re.search(COULD_NOT_CHECK, text) is not None
        and not _states(text, item.value)
    )


def _passes_the_users_wording(message: dict, item: Sum) -> bool:
    calls = _calls(message, "calculator")
    return bool(calls) and all(
        "".join(str((_arguments(call) or {}).get("expression", "")).split())
        == "".join(item.expression.split())
        for call in calls
    )


LESSONS = (
    Lesson(
        "calculator",
        "Use the calculator tool for arithmetic instead of answering from memory.",
        sums_in_words=True,
        environment=lambda number: ToolEnvironment(seed=number),
        pinned_turn=first_turn,
        behaved=_calls_calculator_with_numbers,
        checks=lambda item: [
            {"kind": "calls_tool", "value": "calculator"},
            {
                "kind": "tool_argument",
                "value": {"tool": "calculator", "argument": "expression", "pattern": r"\d"},
            },
        ],
        correction=lambda message, item: _call(item.expression),
    ),
    Lesson(
        "retry-once",
        "When a tool call fails, call the same tool again once before answering.",
        sums_in_words=True,
        environment=lambda number: FailingFirst(1, seed=number),
        pinned_turn=first_turn_after_a_failure,
        behaved=lambda message, item: bool(_calls(message, "calculator")),
        checks=lambda item: [{"kind": "calls_tool", "value": "calculator"}],
        correction=lambda message, item: _call(item.expression),
    ),
    Lesson(
        "honest-failure",
        "When the tool keeps failing, tell the user you could not check the answer; never "
        "invent a result.",
        sums_in_words=True,
        environment=lambda number: ToolEnvironment(failure_rate=1.0, seed=number),
        pinned_turn=turn_after_repeated_failures,
        behaved=_honest,
        checks=lambda item: [
            {"kind": "regex", "value": COULD_NOT_CHECK},
            {"kind": "not_regex", "value": _number_pattern(item.value)},
        ],
        correction=lambda message, item: {
            "role": "assistant",
            "content": "Sorry, I could not check that: the calculator is not answering.",
        },
    ),
    Lesson(
        "users-wording",
        "Pass the user's expression to the calculator exactly as they wrote it.",
        sums_in_words=False,
        environment=lambda number: ToolEnvironment(seed=number),
        pinned_turn=first_calculator_call,
        behaved=_passes_the_users_wording,
        checks=lambda item: [
            {
                "kind": "tool_argument",
                "value": {
                    "tool": "calculator",
                    "argument": "expression",
                    "pattern": _as_written(item.expression),
                },
            },
        ],
        correction=lambda message, item: _call(item.expression),
    ),
    Lesson(
        "answer-with-the-result",
        "Once the calculator has returned the result, answer the user with it; do not call "
        "the calculator again.",
        sums_in_words=True,
        environment=lambda number: FailingFirst(1, seed=number),
        pinned_turn=first_turn_after_a_result,
        behaved=_answers_with_the_result,
        checks=lambda item: [
            {"kind": "no_tool_call", "value": True},
            {"kind": "regex", "value": _number_pattern(item.value)},
        ],
        correction=lambda message, item: {
            "role": "assistant",
            "content": f"{item.expression} = {_number_text(item.value)}.",
        },
    ),
)


# A lesson about what follows a call applies once the agent calls; answering after the retried
# call, once it retries; the honest answer after two failures, once it calls again after one.
IN_THE_ORDER_THEY_APPLY = [
    "calculator",
    "retry-once",
    "answer-with-the-result",
    "honest-failure",
    "users-wording",
]


def _as_written(expression: str) -> str:
    """A pattern (RE2) for the expression as written, spaces aside."""
    return r"^\s*" + r"\s*".join(re.escape(token) for token in expression.split()) + r"\s*\z"


def _number_pattern(value: float) -> str:
    """A pattern (RE2: no look-behind) for the number as a whole, "561" in "561." or "-561"."""
    return rf"(?:^|[^\d.]){re.escape(_number_text(value))}(?:$|[^\d])"


def _number_text(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


# --- episodes through the gateway ------------------------------------------------------------


@dataclass(frozen=True)
class Episode:
    trace_id: str
    item: Sum
    result: EpisodeResult


def run_episodes(
    product,
    lesson: Lesson,
    items: list[Sum],
    label: str,
    *,
    instructions: str = "",
    direct: tuple[str, str] | None = None,
) -> list[Episode]:
    """The items' episodes through the gateway, or with `direct` (vLLM's URL, a model name)
    on the model server itself."""
    if direct:
        (base_url, model), key = direct, "-"  # vLLM asks for no key
    else:
        base_url, key, model = product.gateway, product.key, ALIAS

    def one(number: int) -> Episode:
        trace_id = f"{lesson.name}-{label}-{number}"
        with httpx.Client(headers=PROXY_HEADERS) as client:
            result = run_episode(
                client,
                base_url=base_url,
                api_key=key,
                model=model,
                task=items[number].task(trace_id),
                env=lesson.environment(number),
                time_budget_s=EPISODE_BUDGET_S,
                max_steps=MAX_STEPS,
                trace_id=None if direct else trace_id,
                tool_choice="auto",
                instructions=instructions,
            )
            if not direct:  # as the demo harness does by default: a run's good traces come of it
                report_outcome(
                    client, base_url=base_url, api_key=key, trace_id=trace_id, result=result
                )
        return Episode(trace_id, items[number], result)

    with ThreadPoolExecutor(max_workers=2) as pool:  # vLLM batches the two
        return list(pool.map(one, range(len(items))))


@dataclass(frozen=True)
class Measure:
    applicable: int
    behaved: int
    episodes: int
    successes: int
    calls: int
    valid_calls: int

    @property
    def behaviour(self) -> str:
        return f"{self.behaved / self.applicable:.2f} ({self.behaved}/{self.applicable})" if (
            self.applicable
        ) else "- (0 applicable)"  # fmt: skip

    @property
    def success(self) -> str:
        return f"{self.successes / self.episodes:.2f}"

    @property
    def validity(self) -> str:
        return f"{self.valid_calls}/{self.calls}" if self.calls else "- (no calls)"


def _valid(function: dict) -> bool:
    """The call parses as a JSON object and fits its tool's schema."""
    arguments = _arguments(function)
    if arguments is None or function.get("name") not in SCHEMAS:
        return False
    try:
        jsonschema.validate(arguments, SCHEMAS[function["name"]])
    except jsonschema.ValidationError:
        return False
    return True


def measure(lesson: Lesson, episodes: list[Episode]) -> Measure:
    applicable = behaved = calls = valid = 0
    for episode in episodes:
        messages = episode.result.messages
        turn = lesson.pinned_turn(messages)
        if turn is not None:
            applicable += 1
            behaved += lesson.behaved(messages[turn], episode.item)
        for message in messages:
            for function in _calls(message):
                calls += 1
                valid += _valid(function)
    return Measure(
        applicable,
        behaved,
        len(episodes),
        sum(episode.result.success for episode in episodes),
        calls,
        valid,
    )


def give_feedback(product, lesson: Lesson, episodes: list[Episode], corrections: int) -> list:
    """The lesson's feedback on every episode it applies to; the first few corrected."""

    def recorded(trace_id: str):
        response = product.api.get(f"/api/v1/traces/{trace_id}")
        return response.json() if response.status_code == 200 else None

    given = []
    for episode in episodes:
        turn = lesson.pinned_turn(episode.result.messages)
        if turn is None:
            continue
        # The gateway records off the request path: wait until the trace holds the turn.
        wait_for(
            lambda trace_id=episode.trace_id, turn=turn: (
                (found := recorded(trace_id)) and len(found["messages"]) > turn
            ),
            60,
            f"the gateway to record {episode.trace_id}",
        )
        body = {"text": lesson.feedback, "turn": turn, "checks": lesson.checks(episode.item)}
        if len(given) < corrections:
            body["correction"] = lesson.correction(episode.result.messages[turn], episode.item)
        response = product.api.post(f"/api/v1/traces/{episode.trace_id}/feedback", json=body)
        response.raise_for_status()
        given.append(episode.trace_id)
    return given


def wait_for_targets(api: httpx.Client, trace_ids: list[str]) -> dict[str, int]:
    def statuses():
        found = [
            api.get(f"/api/v1/traces/{trace_id}").json()["review"]["feedback"][0]["status"]
            for trace_id in trace_ids
        ]
        return found if "open" not in found else None

    counts: dict[str, int] = {}
    for status in wait_for(statuses, TARGETS_TIMEOUT_S, "targets for every feedback"):
        counts[status] = counts.get(status, 0) + 1
    return counts


def load_refused(vllm_url: str, path) -> str:
    """Load a candidate the gate refused on vLLM under a fresh name (names are never reused)."""
    name = f"{path.name}-refused-{secrets.token_hex(3)}"
    response = httpx.post(
        f"{vllm_url.removesuffix('/v1')}/v1/load_lora_adapter",
        json={"lora_name": name, "lora_path": str(path)},
        timeout=120,
    )
    response.raise_for_status()
    return name


def print_ledger(api: httpx.Client) -> None:
    """The project's lessons ledger: whether what earlier lessons taught is kept."""

    def rate(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    for lesson in api.get("/api/v1/lessons").json()["lessons"]:
        versions = ", ".join(f"v{v['version']} {rate(v['held_out'])}" for v in lesson["versions"])
        print(f"ledger: {lesson['text'][:40]!r} {lesson['state']}; held out {versions}", flush=True)


def run_lesson(product, lesson: Lesson, args, seed: int) -> list[str]:
    """The lesson end to end; its table rows."""
    started = time.monotonic()
    items = sums(args.reviewed + args.held_out, seed=seed, in_words=lesson.sums_in_words)
    reviewed, held_out = items[: args.reviewed], items[args.reviewed :]
    recorded = run_episodes(product, lesson, reviewed, "reviewed")
    base = run_episodes(product, lesson, held_out, "base")
    prompted = run_episodes(product, lesson, held_out, "prompt", instructions=lesson.feedback)
    given = give_feedback(product, lesson, recorded, args.corrections)
    print(
        f"\nlesson {lesson.name!r}: applies to {len(given)} of {len(recorded)} reviewed episodes "
        f"({measure(lesson, recorded).behaviour} already followed it); episodes "
        f"{(time.monotonic() - started) / 60:.1f} min",
        flush=True,
    )
    rows = [("base", measure(lesson, base)), ("feedback in the prompt", measure(lesson, prompted))]
    outcome = "no feedback applied: not trained"
    if given:
        counts = wait_for_targets(product.api, given)
        print(f"feedback {counts}", flush=True)
        run, timeline, _ = run_to_the_end(product.api, {"mode": "sft"}, args.max_seconds)
        facts = (run["eval"].get("regression") or {}).get("summary") or {}
        outcome = (
            f"run {run['status']} ({run.get('error') or 'no error'}), adapter "
            f"{run['adapter'] or '-'}, {facts.get('regressed', 0)} of {sum(facts.values())} facts "
            f"broken, {max(timeline.values()) / 60:.1f} min click -> end"
        )
        if run["status"] == "deployed":
            time.sleep(2.5)  # the gateway caches routes for 2 s
            rows.append(
                ("adapter", measure(lesson, run_episodes(product, lesson, held_out, "adapter")))
            )
        elif run["status"] == "gate_failed" and run["adapter"]:
            refused = load_refused(args.vllm_url, product.adapters_dir / run["adapter"])
            episodes = run_episodes(
                product, lesson, held_out, "refused", direct=(args.vllm_url, refused)
            )
            rows.append(("refused candidate", measure(lesson, episodes)))
    print(f"{outcome}; lesson {(time.monotonic() - started) / 60:.1f} min", flush=True)
    print_ledger(product.api)
    table = [
        f"| {lesson.name} | {name} | {m.behaviour} | {m.success} | {m.validity} |"
        for name, m in rows
    ]
    print("\n".join(table), flush=True)
    return [*table, f"| {lesson.name} | outcome | {outcome} | | |"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    names = [lesson.name for lesson in LESSONS]
    parser.add_argument("--lessons", nargs="+", choices=names, default=IN_THE_ORDER_THEY_APPLY)
    parser.add_argument("--reviewed", type=int, default=16, help="reviewed episodes per lesson")
    parser.add_argument("--corrections", type=int, default=4, help="corrected of those")
    parser.add_argument("--held-out", type=int, default=8, help="held-out episodes per lesson")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vllm-url", default="http://127.0.0.1:8100/v1")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/9")
    parser.add_argument("--admin-url", default=os.environ.get("BENCH_ADMIN_DATABASE_URL",
                        "postgresql://postgres@127.0.0.1:5432/test"))  # fmt: skip
    parser.add_argument("--max-seconds", type=float, default=3600.0, help="per retrain")
    parser.add_argument(
        "--database", default=BENCH_DATABASE, help="the scratch database (and project) name"
    )
    parser.add_argument(
        "--screenshots",
        metavar="FOLDER",
        help="the monitors page after each lesson, as monitors-after-<lesson>.png",
    )
    args = parser.parse_args()

    with running_product(
        admin_url=args.admin_url,
        database=args.database,
        vllm_url=args.vllm_url,
        redis_url=args.redis_url,
        alias=ALIAS,
    ) as product:
        product.api.patch(
            "/api/v1/settings", json={"auto_approve": "checks_pass"}
        ).raise_for_status()
        table = ["| lesson | served | behaviour rate | success | valid calls |",
                 "|---|---|---|---|---|"]  # fmt: skip
        # In the order given: a lesson about failures applies only once the agent calls tools.
        for name in args.lessons:
            number = names.index(name)  # a lesson's seed follows its place in LESSONS
            table += run_lesson(product, LESSONS[number], args, seed=args.seed * 1000 + number)
            if args.screenshots:
                os.makedirs(args.screenshots, exist_ok=True)
                shot = os.path.join(args.screenshots, f"monitors-after-{name}.png")
                try:
                    screenshot(product, shot, "monitors")
                    print(f"screenshot: {shot}", flush=True)
                except Exception as error:  # a picture is not worth the lessons after it
                    print(f"no screenshot ({error!r})", flush=True)
        print("\n" + "\n".join(table))


if __name__ == "__main__":
    main()
