"""The teacher on the real vLLM CPU server with the bundled model: its edit of an original answer,
made over vLLM's token ids, is the edit the same model makes in process; its samples repeat for
the same seed."""

import httpx
import pytest
from django.conf import settings
from transformers import AutoModelForCausalLM, AutoTokenizer

from training.targets import (
    EditRequest,
    SampleRequest,
    TransformersTeacher,
    VllmTeacher,
    WorkedExample,
    hint_context,
)

pytestmark = pytest.mark.slow

FEEDBACK = "Always begin your answer with 'Answer:'."
EXAMPLES = [
    WorkedExample.reply(
        "Why do cats like boxes?",
        "Answer: Cats often enjoy boxes because enclosed spaces feel safe and warm.",
    ),
    WorkedExample.reply(
        "How do rainbows form?",
        "Answer: Rainbows form when sunlight is bent and reflected inside raindrops.",
    ),
]


def test_the_servers_edit_of_an_answer_is_the_one_made_in_process(vllm_url, bundled_model_dir):
    model = AutoModelForCausalLM.from_pretrained(bundled_model_dir, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(bundled_model_dir, local_files_only=True)
    question = [{"role": "user", "content": "What is the capital of Peru?"}]
    request = EditRequest(
        hint_context(question, FEEDBACK, EXAMPLES), "The capital of Peru is Lima.", max_tokens=32
    )

    with httpx.Client(timeout=120) as client:
        served = VllmTeacher(vllm_url, settings.BASE_MODEL, client).edit(request)
    in_process = TransformersTeacher(model, tokenizer).edit(request)

    assert served == in_process
    # The lesson's words put in front, the answer's own kept after them.
    assert served.message["content"].startswith("Answer:")
    assert "Lima" in served.message["content"]


def test_the_servers_samples_repeat_for_the_same_seed_and_differ_between_rounds(vllm_url):
    question = [{"role": "user", "content": "Why do cats like boxes?"}]
    request = SampleRequest(
        hint_context(question, FEEDBACK, EXAMPLES), n=4, max_tokens=24, temperature=1.0
    )

    def two_rounds(seed: int) -> list[str]:
        with httpx.Client(timeout=120) as client:
            teacher = VllmTeacher(vllm_url, settings.BASE_MODEL, client, seed=seed)
            rounds = [teacher.sample(request), teacher.sample(request)]
        return [sample.message["content"] for samples in rounds for sample in samples]

    first, again, other = two_rounds(seed=0), two_rounds(seed=0), two_rounds(seed=100)

    assert first == again
    assert first != other
    assert len(set(first)) > 4  # the second round draws new samples, not the first's again
