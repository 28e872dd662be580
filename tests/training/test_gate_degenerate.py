"""A degenerate candidate (one fixed, check-passing answer to everything) against the real gate
at default settings, on the bundled SmolLM2-135M: the serving side is the base answering for
real; the candidate is a replier that writes the same reply to every prompt. The feedback's
check alone cannot tell it from a lesson learned (every feedback item is fixed), the facts the
base answers right can, and the gate's reason says so."""

import pytest

from training.candidates import choose_candidate
from training.config import TrainingConfig
from training.eval_sets import general_regression_items
from training.evaluation import evaluate_adapter
from training.gate import GateThresholds
from training.repliers import InProcessReplier
from training.targets import hint_context
from training.trainer import TrainingResult, add_lora, load_base_model

pytestmark = pytest.mark.slow

LESSON = "Always begin your answer with 'Answer:'."
ONE_ANSWER = "Answer: Yes."
QUESTIONS = [
    "What is the capital of Japan?",
    "How many legs does a spider have?",
    "Who wrote Hamlet?",
    "What do bees make?",
]


class OneAnswerReplier:
    """The candidate answers ONE_ANSWER to every prompt; the serving side (the base, adapter
    off) answers as the model does."""

    def __init__(self, tokenizer) -> None:
        self.reply = [
            *tokenizer(ONE_ANSWER, add_special_tokens=False)["input_ids"],
            tokenizer.eos_token_id,
        ]
        self.serving = InProcessReplier(tokenizer.eos_token_id)
        self.candidate_prompts = 0

    def greedy_replies(self, model, prompts, budgets, *, adapter_on):
        if not adapter_on:
            return self.serving.greedy_replies(model, prompts, budgets, adapter_on=False)
        self.candidate_prompts += len(prompts)
        return [list(self.reply[:budget]) for budget in budgets]


def test_one_check_passing_answer_to_everything_is_refused_at_default_settings(
    bundled_model_dir,
):
    config = TrainingConfig()
    base, tokenizer = load_base_model(bundled_model_dir, config)
    model = add_lora(base, config)
    replier = OneAnswerReplier(tokenizer)
    feedback_items = [
        {
            "feedback_id": index,
            "context": [{"role": "user", "content": question}],
            "teacher_context": hint_context([{"role": "user", "content": question}], LESSON),
            "checks": [{"kind": "regex", "value": "^Answer:"}],
            "lesson": LESSON,
            "held_out": index == 3,
        }
        for index, question in enumerate(QUESTIONS)
    ]
    facts = general_regression_items()
    serving_side: dict = {}

    report, [candidate] = choose_candidate(
        model,
        config,
        TrainingResult(loss_curve=[0.0], steps=1, tokens=0, seconds=0.0),
        evaluate=lambda: evaluate_adapter(
            model, tokenizer, feedback_items, facts, serving_side, replier=replier
        ),
        thresholds=GateThresholds(),
    )

    # It is degenerate, and the feedback's check rewards it: every item passes after.
    assert replier.candidate_prompts == len(feedback_items) + len(facts)
    rows = [*report["items"], *report["held_out"]["items"], *report["regression"]["items"]]
    assert {row["after"]["reply"] for row in rows} == {ONE_ANSWER}
    [lesson] = report["per_lesson"]
    assert lesson["trained_adherence"]["after"] == 1.0
    assert lesson["held_out_adherence"]["after"] == 1.0
    # The facts the base answers right, it answers wrong: refused, and the reason says why.
    broken = report["regression"]["summary"]["regressed"]
    assert broken > GateThresholds().max_regression_failures
    assert candidate["passed"] is False
    assert (
        f"{broken} regression prompt(s) answered right by the serving model and wrong after"
        in candidate["reason"]
    )
