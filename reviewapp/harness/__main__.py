"""Run the demo agent against an OpenAI-compatible endpoint (the gateway, or vLLM directly).

    python -m reviewapp.harness --base-url http://127.0.0.1:8000/v1 --api-key KEY \\
        --model NAME --episodes 12 --tool-failure-rate 0.1 --concurrency 2 [--tool-choice auto]
"""

import argparse
import random
import secrets
import statistics
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed

import httpx

from reviewapp.harness.agent import (
    TOOL_CHOICES,
    EpisodeResult,
    api_base_for,
    report_outcome,
    run_episode,
)
from reviewapp.harness.tasks import TASKS, Task
from reviewapp.harness.tools import ToolEnvironment

TERMINATIONS = ("completed", "tool_error", "timeout", "max_steps", "error")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m reviewapp.harness", description=__doc__)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1", help="OpenAI base URL")
    parser.add_argument("--api-key", required=True, help="project API key (any text for vLLM)")
    parser.add_argument("--model", required=True, help="model name to ask for")
    parser.add_argument("--episodes", type=int, default=12)
    parser.add_argument("--tool-failure-rate", type=float, default=0.1, help="0 to 1, injected")
    parser.add_argument("--tool-latency", type=float, default=0.0, help="seconds per tool call")
    parser.add_argument(
        "--slow-tool-rate", type=float, default=1.0, help="0 to 1: the calls that take the latency"
    )
    parser.add_argument("--time-budget", type=float, default=30.0, help="seconds per episode")
    parser.add_argument("--max-steps", type=int, default=3, help="model calls per episode")
    parser.add_argument(
        "--tool-choice",
        choices=TOOL_CHOICES,
        default="named",
        help="named: the task's tool first, then an answer; auto: the model chooses every step",
    )
    parser.add_argument("--seed", type=int, default=0, help="task order and tool failures")
    parser.add_argument("--concurrency", type=int, default=2, help="episodes in flight at once")
    parser.add_argument(
        "--wait",
        type=float,
        default=60.0,
        help="seconds to wait for the endpoint to answer before the first episode",
    )
    parser.add_argument(
        "--no-trace-ids",
        action="store_true",
        help="send no X-Trace-Id; the gateway then groups calls by their messages alone",
    )
    parser.add_argument(
        "--report-outcomes",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="POST each episode's outcome to the product (default: on with trace ids)",
    )
    args = parser.parse_args(argv)
    for name in ("episodes", "max_steps", "concurrency"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if not 0.0 <= args.tool_failure_rate <= 1.0:
        parser.error("--tool-failure-rate must be between 0 and 1")
    if not 0.0 <= args.slow_tool_rate <= 1.0:
        parser.error("--slow-tool-rate must be between 0 and 1")
    if args.tool_latency < 0 or args.time_budget <= 0:
        parser.error("--tool-latency must be >= 0 and --time-budget > 0")
    if args.report_outcomes is None:
        args.report_outcomes = not args.no_trace_ids
    if args.report_outcomes and args.no_trace_ids:
        parser.error("--report-outcomes needs trace ids (drop --no-trace-ids)")
    if args.report_outcomes:
        try:
            api_base_for(args.base_url)
        except ValueError as error:
            parser.error(str(error))
    return args


def _task_order(seed: int) -> list[Task]:
    order = list(TASKS)
    random.Random(seed).shuffle(order)
    return order


def run_demo(args: argparse.Namespace, client: httpx.Client) -> list[EpisodeResult]:
    """Run the episodes, printing a line as each ends; returns the results in finishing order."""
    tasks = _task_order(args.seed)
    run_token = secrets.token_hex(3)  # a re-run with the same seed makes new traces

    def episode(number: int) -> tuple[str | None, EpisodeResult, str]:
        trace_id = None if args.no_trace_ids else f"demo-{args.seed}-{run_token}-{number}"
        env = ToolEnvironment(
            failure_rate=args.tool_failure_rate,
            latency_s=args.tool_latency,
            slow_rate=args.slow_tool_rate,
            seed=args.seed * 100_003 + number,  # per episode: reproducible under concurrency
        )
        result = run_episode(
            client,
            base_url=args.base_url,
            api_key=args.api_key,
            model=args.model,
            task=tasks[number % len(tasks)],
            env=env,
            time_budget_s=args.time_budget,
            max_steps=args.max_steps,
            trace_id=trace_id,
            tool_choice=args.tool_choice,
        )
        note = ""
        if args.report_outcomes and trace_id:
            try:
                report_outcome(
                    client,
                    base_url=args.base_url,
                    api_key=args.api_key,
                    trace_id=trace_id,
                    result=result,
                )
                note = "outcome recorded"
            except httpx.HTTPError as error:
                note = f"outcome not recorded: {error}"
        return trace_id, result, note

    print(
        f"{args.episodes} episodes against {args.base_url} ({args.model}), run {run_token}, "
        f"tool failure rate {args.tool_failure_rate}, latency {args.tool_latency}s, "
        f"tool choice {args.tool_choice}"
    )
    results: list[EpisodeResult] = []
    with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
        futures = [pool.submit(episode, number) for number in range(args.episodes)]
        for done, future in enumerate(as_completed(futures), start=1):
            trace_id, result, note = future.result()
            results.append(result)
            # repr(): model text may hold terminal control characters.
            print(
                f"[{done}/{args.episodes}] {trace_id or '-'} {result.task_id} "
                f"{result.termination} success={result.success} "
                f"tools={result.tool_calls} failed={result.tool_failures} "
                f"{result.elapsed_s:.1f}s answer={result.answer[:80]!r}"
                + (f" error={result.error[:120]!r}" if result.error else "")
                + (f" ({note})" if note else "")
            )
    return results


def wait_for_endpoint(client: httpx.Client, base_url: str, timeout_s: float) -> None:
    """Until the endpoint answers at all (a web process still starting refuses connections:
    bin/run starts the harness as soon as the model answers, which a running one does first)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            client.get(f"{base_url}/models", timeout=2)
            return
        except httpx.TransportError:
            if time.monotonic() >= deadline:
                return  # the episodes report what is wrong
            time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with httpx.Client(limits=httpx.Limits(max_connections=args.concurrency * 2)) as client:
        wait_for_endpoint(client, args.base_url, args.wait)
        results = run_demo(args, client)
    print(summarize(results))
    return 1 if all(result.termination == "error" for result in results) else 0


def summarize(results: list[EpisodeResult]) -> str:
    counts = Counter(result.termination for result in results)
    answers = [result.answer for result in results if result.answer]
    successes = sum(result.success for result in results)
    return (
        "summary: "
        + ", ".join(f"{name} {counts[name]}" for name in TERMINATIONS)
        + f"; success {successes}/{len(results)} ({successes / len(results):.0%})"
        + f"; tool calls {sum(r.tool_calls for r in results)}"
        + f", tool failures {sum(r.tool_failures for r in results)}"
        + f"; mean episode {statistics.fmean(r.elapsed_s for r in results):.1f}s"
        + "; mean answer "
        + (f"{statistics.fmean(len(a.split()) for a in answers):.1f} words" if answers else "-")
    )


if __name__ == "__main__":
    sys.exit(main())
