"""The demo agent's tools, their OpenAI definitions, and an environment that makes them unreliable.

Tools never raise: every problem (bad input, an injected outage) comes back as a string starting
with "Error:", which the model sees and the trace page marks as a tool error.
"""

import ast
import json
import operator
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

ERROR_PREFIX = "Error:"
MAX_EXPONENT = 100  # 2 ** 100 is fine; 9 ** 9 ** 9 would take the process down
MAX_MAGNITUDE = 1e15  # larger operands are refused before they reach an exponent or a product
MAX_EXPRESSION_LENGTH = 200

_BINARY_OPERATORS: dict[type, Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY_OPERATORS: dict[type, Callable[[float], float]] = {
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


class _Refused(Exception):
    """An expression the calculator will not evaluate; the message is shown to the model."""


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY_OPERATORS:
        return _UNARY_OPERATORS[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY_OPERATORS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if abs(left) > MAX_MAGNITUDE or abs(right) > MAX_MAGNITUDE:
            raise _Refused("numbers that large are not supported")
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise _Refused(f"exponents above {MAX_EXPONENT} are not supported")
        return _BINARY_OPERATORS[type(node.op)](left, right)
    raise _Refused("only numbers, + - * / // % ** and parentheses are allowed")


def _format_number(value: float) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < MAX_MAGNITUDE:
        return str(int(value))
    if isinstance(value, float):
        return f"{value:.10g}"
    return str(value)


def calculator(expression: str) -> str:
    """Evaluate plain arithmetic; anything else (names, calls, huge powers) is an error string."""
    if len(expression) > MAX_EXPRESSION_LENGTH:
        return f"{ERROR_PREFIX} expression longer than {MAX_EXPRESSION_LENGTH} characters"
    # Models write "^" for powers, and the multiplication and division signs.
    normalized = expression.replace("^", "**").replace("\u00d7", "*").replace("\u00f7", "/")
    try:
        tree = ast.parse(normalized.strip(), mode="eval")
        value = _evaluate(tree.body)
    except SyntaxError:
        return f"{ERROR_PREFIX} could not parse {expression!r} as arithmetic"
    except ZeroDivisionError:
        return f"{ERROR_PREFIX} division by zero"
    except (_Refused, OverflowError) as error:
        return f"{ERROR_PREFIX} {error}"
    if isinstance(value, complex):
        return f"{ERROR_PREFIX} the result is not a real number"
    return _format_number(value)


HANDBOOK: dict[str, str] = {
    "refunds": (
        "Refunds are issued within 30 days of purchase to the original payment method. "
        "Once approved, a refund takes 5 to 7 business days to appear."
    ),
    "shipping": (
        "Standard shipping takes 3 to 5 business days and is free on orders over $50. "
        "Express shipping takes 1 to 2 business days and costs $15."
    ),
    "support hours": (
        "Support is open Monday to Friday, 9:00 to 17:00 UTC. "
        "At weekends only email support is available, answered within 24 hours."
    ),
    "warranty": (
        "All devices carry a 2-year warranty covering manufacturing defects. "
        "Accidental damage is not covered."
    ),
    "returns": (
        "Items can be returned within 30 days if unused and in the original packaging. "
        "Return shipping is free with the prepaid label from your account page."
    ),
    "payment methods": (
        "We accept Visa, Mastercard, PayPal and bank transfer. "
        "Bank transfers take up to 3 business days to clear."
    ),
}


def _topic_key(topic: str) -> str | None:
    wanted = " ".join(topic.lower().replace("_", " ").split())
    if wanted in HANDBOOK:
        return wanted
    # "refund policy" or "support" still find their document; a singular form too.
    for key in HANDBOOK:
        if key in wanted or wanted in key or key.rstrip("s") in wanted:
            return key
    return None


def lookup(topic: str) -> str:
    """Return the handbook document for a topic, or say there is none (a normal result)."""
    key = _topic_key(topic) if topic.strip() else None
    if key is None:
        return f"No document about {topic!r}. Known topics: {', '.join(HANDBOOK)}."
    return HANDBOOK[key]


def clock(now: datetime | None = None) -> str:
    """The current UTC time as ISO 8601 with the weekday; `now` fixes it for tests."""
    moment = (now or datetime.now(UTC)).astimezone(UTC)
    return moment.strftime("%A %Y-%m-%dT%H:%M:%SZ")


def _function(name: str, description: str, properties: dict) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            # strict: vLLM then constrains the arguments to this schema, not only the call's
            # envelope; OpenAI's strict mode wants every property required and no others.
            "strict": True,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": list(properties),
                "additionalProperties": False,
            },
        },
    }


TOOL_DEFINITIONS: list[dict] = [
    _function(
        "calculator",
        "Evaluate an arithmetic expression such as '12 * (3 + 4)'.",
        {"expression": {"type": "string", "description": "numbers and + - * / // % ** ( )"}},
    ),
    _function(
        "lookup",
        "Read the company handbook document about one topic.",
        # An enum keeps a small model to topics that exist (it still picks the wrong one).
        {"topic": {"type": "string", "enum": list(HANDBOOK)}},
    ),
    # A parameter-less object let SmolLM2 pad "{" with whitespace until max_tokens ran out.
    _function(
        "clock",
        "Get the current date and time.",
        {"timezone": {"type": "string", "enum": ["UTC"]}},
    ),
]


TOOL_NAMES = tuple(definition["function"]["name"] for definition in TOOL_DEFINITIONS)


@dataclass(frozen=True)
class ToolResult:
    content: str  # what goes back to the model as the tool message
    failed: bool
    timed_out: bool = False


class ToolEnvironment:
    """Runs tool calls the way a flaky production backend would: slowly, and sometimes not at all.

    One environment per episode: the seeded RNG and the counters are not shared across threads.
    """

    def __init__(
        self,
        failure_rate: float = 0.0,
        latency_s: float = 0.0,
        seed: int = 0,
        now: datetime | None = None,
        slow_rate: float = 1.0,
    ) -> None:
        if not 0.0 <= failure_rate <= 1.0:
            raise ValueError("failure_rate must be between 0 and 1")
        if latency_s < 0:
            raise ValueError("latency_s must not be negative")
        if not 0.0 <= slow_rate <= 1.0:
            raise ValueError("slow_rate must be between 0 and 1")
        self.failure_rate = failure_rate
        self.latency_s = latency_s
        self.slow_rate = slow_rate  # the share of calls that take latency_s; others are instant
        self.fixed_now = now
        self._rng = random.Random(seed)
        # Its own stream, so adding slowness does not change which calls fail.
        self._slow_rng = random.Random(seed + 1)
        self.calls = 0
        self.failures = 0  # every error result, injected or not
        self.injected_failures = 0

    def now(self) -> datetime:
        return self.fixed_now or datetime.now(UTC)

    def run(self, name: str, arguments: str, *, timeout_s: float | None = None) -> ToolResult:
        """Execute one call; a call slower than timeout_s is abandoned after timeout_s."""
        self.calls += 1
        slow = self.slow_rate >= 1.0 or self._slow_rng.random() < self.slow_rate
        latency_s = self.latency_s if slow else 0.0
        if timeout_s is not None and latency_s > timeout_s:
            time.sleep(max(timeout_s, 0.0))
            self.failures += 1
            return ToolResult(f"{ERROR_PREFIX} {name} timed out", failed=True, timed_out=True)
        time.sleep(latency_s)
        # Draw for every call, so which calls fail depends on the seed and not on the arguments.
        if self._rng.random() < self.failure_rate:
            self.failures += 1
            self.injected_failures += 1
            return ToolResult(f"{ERROR_PREFIX} {name} service unavailable (injected)", failed=True)
        content = self._execute(name, arguments)
        failed = content.startswith(ERROR_PREFIX)
        self.failures += failed
        return ToolResult(content, failed=failed)

    def _execute(self, name: str, arguments: str) -> str:
        try:
            parsed = json.loads(arguments or "{}")
        except json.JSONDecodeError:
            return f"{ERROR_PREFIX} the arguments are not valid JSON: {arguments[:200]!r}"
        if not isinstance(parsed, dict):
            return f"{ERROR_PREFIX} the arguments must be a JSON object"
        if name == "calculator":
            expression = parsed.get("expression")
            if not isinstance(expression, str):
                return f"{ERROR_PREFIX} calculator needs an 'expression' string"
            return calculator(expression)
        if name == "lookup":
            topic = parsed.get("topic")
            if not isinstance(topic, str):
                return f"{ERROR_PREFIX} lookup needs a 'topic' string"
            return lookup(topic)
        if name == "clock":
            if parsed.get("timezone", "UTC") != "UTC":
                return f"{ERROR_PREFIX} the clock only knows UTC"
            return clock(self.now())
        return f"{ERROR_PREFIX} no tool named {name!r}; available: {', '.join(TOOL_NAMES)}"
