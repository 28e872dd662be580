"""The whole loop's latency: from clicking Retrain to the first gateway answer from the new adapter.

Run from the repository root, in the project's virtualenv, with PostgreSQL and Redis reachable
and vLLM serving the bundled model (`python manage.py serve_model`, or pass --vllm-url):

    python bench/loop.py --feedback 16

It creates a scratch database, starts the web process (uvicorn, production settings) and a Celery
worker on it, ingests --feedback short traces and gives each feedback through the API with a
corrected reply (so targets need no teacher), then starts a retrain exactly as the Retrain button
does (`POST /api/v1/runs`). Meanwhile one client keeps calling the project's model alias through
the gateway, one call in flight at a time: before the retrain, during training and the deploy,
and for a few seconds after the adapter first answers. It reports:
- the run's timeline (each status and when it was first seen) and the time from the click to the
  first gateway answer that came from the adapter, next to the training seconds inside it;
- the adapter load time on vLLM (`/v1/load_lora_adapter` of the same directory under fresh
  names), against one short base generation measured in the same run;
- the base calls made while the run trained, evaluated and deployed: how many failed (goal: 0)
  and their latency against the calls before the click (the ratio is the slowdown harness
  traffic saw while the same two cores trained).
Everything listens on 127.0.0.1; every wait has a time limit (--max-seconds for the run).
"""

import argparse
import os
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from product import (
    MODEL,
    PROXY_HEADERS,
    add_product_arguments,
    run_to_the_end,
    running_product,
    wait_for,
)

BENCH_DATABASE = "apprentice_bench_loop"
ALIAS = "support-agent"  # what the harness asks for; the gateway routes it
QUESTIONS = [
    ("What is the capital of Japan?", "Tokyo"), ("How many legs does a spider have?", "Eight"),
    ("What color is grass?", "Green"), ("Who wrote Hamlet?", "William Shakespeare"),
    ("What is 3 plus 4?", "7"), ("What is the largest ocean?", "The Pacific Ocean"),
    ("How many minutes are in an hour?", "60"), ("What do bees make?", "Honey"),
    ("What is frozen water called?", "Ice"), ("Which planet is red?", "Mars"),
    ("How many wheels does a bicycle have?", "Two"), ("What is the opposite of up?", "Down"),
    ("What animal says moo?", "A cow"), ("What is the first letter of the alphabet?", "A"),
    ("How many sides does a triangle have?", "Three"), ("What gas do we breathe in?", "Oxygen"),
    ("What is the color of the sun?", "Yellow"), ("How many days are in a year?", "365"),
    ("What is the capital of Italy?", "Rome"), ("What is 10 minus 3?", "7"),
]  # fmt: skip
AFTER_ADAPTER_S = 5.0  # keep calling this long after the adapter first answers
CALL_TIMEOUT_S = 120.0


@dataclass
class Call:
    started: float
    seconds: float
    ok: bool
    model: str


class Traffic(threading.Thread):
    """One harness-like client calling the alias through the gateway, back to back."""

    def __init__(self, gateway: str, key: str):
        super().__init__(daemon=True)
        self.gateway, self.key = gateway, key
        self.calls: list[Call] = []
        self.stop = threading.Event()

    def run(self) -> None:
        body = {
            "model": ALIAS,
            "messages": [{"role": "user", "content": "Name a fruit."}],
            "max_tokens": 8,
            "temperature": 0,
        }
        headers = {"Authorization": f"Bearer {self.key}", **PROXY_HEADERS}
        with httpx.Client(timeout=CALL_TIMEOUT_S) as client:
            while not self.stop.is_set():
                started = time.monotonic()
                try:
                    response = client.post(
                        f"{self.gateway}/chat/completions", json=body, headers=headers
                    )
                    ok = response.status_code == 200
                    model = response.json().get("model", "") if ok else ""
                except httpx.HTTPError:
                    ok, model = False, ""
                self.calls.append(Call(started, time.monotonic() - started, ok, model))

    def first_answer_from(self, model: str) -> Call | None:
        return next((call for call in list(self.calls) if call.model == model), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--feedback", type=int, default=16, help="feedback items (max 20)")
    add_product_arguments(parser)
    parser.add_argument("--max-seconds", type=float, default=1800.0)
    parser.add_argument("--load-repeats", type=int, default=3)
    args = parser.parse_args()
    if not 1 <= args.feedback <= len(QUESTIONS):
        parser.error(f"--feedback must be between 1 and {len(QUESTIONS)}")
    with running_product(
        admin_url=args.admin_url,
        database=BENCH_DATABASE,
        vllm_url=args.vllm_url,
        redis_url=args.redis_url,
        alias=ALIAS,
    ) as product:
        _give_feedback(product.api, args.feedback)
        _run_loop(product.api, product.gateway, product.key, product.adapters_dir, args)


def _give_feedback(api: httpx.Client, count: int) -> None:
    traces = [
        {
            "external_id": f"q-{number}",
            "messages": [
                {"role": "user", "content": question},
                {"role": "assistant", "content": f"{answer}."},
            ],
        }
        for number, (question, answer) in enumerate(QUESTIONS[:count])
    ]
    response = api.post("/api/v1/traces", json={"traces": traces})
    assert response.status_code == 207, response.text
    for number, (_, answer) in enumerate(QUESTIONS[:count]):
        response = api.post(
            f"/api/v1/traces/q-{number}/feedback",
            json={
                "text": "Always begin your answer with 'Answer:'.",
                "turn": 1,
                "correction": {"role": "assistant", "content": f"Answer: {answer}."},
                "checks": [{"kind": "regex", "value": "^Answer:"}],
            },
        )
        assert response.status_code == 201, response.text


def _run_loop(api: httpx.Client, gateway: str, key: str, adapters_dir: Path, args) -> None:
    traffic = Traffic(gateway, key)
    traffic.start()
    wait_for(lambda: len(traffic.calls) >= 5, 120, "five base calls before the retrain")
    # Targets come from the corrections on the worker; the retrain needs them approved.
    wait_for(
        lambda: (
            api.get(f"/api/v1/traces/q-{args.feedback - 1}").json()["review"]["feedback"][0][
                "status"
            ]
            == "used"
        ),
        120,
        "the worker to turn the corrections into targets",
    )
    run, timeline, clicked = run_to_the_end(api, {"mode": "sft"}, args.max_seconds)
    if run["status"] != "deployed":
        traffic.stop.set()
        raise SystemExit(f"the run ended {run['status']}: {run['error']}")
    adapter = run["adapter"]
    first = wait_for(lambda: traffic.first_answer_from(adapter), 60, "an answer from the adapter")
    time.sleep(AFTER_ADAPTER_S)
    traffic.stop.set()
    traffic.join(timeout=CALL_TIMEOUT_S)

    before = [call for call in traffic.calls if call.started < clicked]
    during = [call for call in traffic.calls if clicked <= call.started <= first.started]
    after = [call for call in traffic.calls if call.started > first.started]
    load_seconds = _adapter_load_seconds(
        args.vllm_url, str(adapters_dir / adapter), args.load_repeats
    )
    base_call = statistics.median(call.seconds for call in before)
    train_seconds = run["eval"].get("train", {}).get("seconds")

    print(f"\nloop: {args.feedback} feedback items, bundled {MODEL}, LoRA, CPU")
    for status, seconds in sorted(timeline.items(), key=lambda item: item[1]):
        print(f"  {status:<11} first seen at {seconds:7.1f} s after the click")
    to_first = first.started + first.seconds - clicked
    print(f"click -> first gateway answer from {adapter}: {to_first:.1f} s "
          f"(training itself: {train_seconds} s)")  # fmt: skip
    print(f"evaluation replies generated on: {run['eval'].get('evaluated_on')}")
    print(
        f"adapter load on vLLM: median {statistics.median(load_seconds):.3f} s over "
        f"{len(load_seconds)} loads; one base call {base_call:.3f} s; "
        f"ratio load / base call {statistics.median(load_seconds) / base_call:.2f}"
    )
    for label, calls in (("before the click", before), ("click -> adapter", during),
                         ("after the adapter", after)):  # fmt: skip
        print(f"  base calls {label:<18} {_summary(calls)}")
    failed = sum(not call.ok for call in during + after)
    slowdown = _p(during, 50) / _p(before, 50)
    print(f"failed calls during the retrain and deploy: {failed} (goal 0); "
          f"p50 slowdown while training on the same cores: {slowdown:.2f}x")  # fmt: skip


def _adapter_load_seconds(vllm_url: str, path: str, repeats: int) -> list[float]:
    """Load the run's adapter directory again under fresh names (vLLM never reloads a name)."""
    root = vllm_url.removesuffix("/v1")
    seconds = []
    with httpx.Client(timeout=120) as client:
        for repeat in range(repeats):
            name = f"bench-load-{os.getpid()}-{repeat}"
            started = time.monotonic()
            response = client.post(
                f"{root}/v1/load_lora_adapter", json={"lora_name": name, "lora_path": path}
            )
            seconds.append(time.monotonic() - started)
            response.raise_for_status()
            client.post(f"{root}/v1/unload_lora_adapter", json={"lora_name": name})
    return seconds


def _p(calls: list[Call], percentile: int) -> float:
    values = sorted(call.seconds for call in calls)
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(len(values) * percentile / 100))]


def _summary(calls: list[Call]) -> str:
    failed = sum(not call.ok for call in calls)
    return (
        f"{len(calls):4d} calls, {failed} failed, p50 {_p(calls, 50):.3f} s, "
        f"p99 {_p(calls, 99):.3f} s"
    )


if __name__ == "__main__":
    main()
