"""The evaluation's greedy replies: in process, cut to each item's budget; on a model server,
with the in-process replies taking over when the server does not answer; which server: the
first listed that answers and serves the run's base model."""

from pathlib import Path

import httpx
import pytest

from tests.fake_upstream import FakeUpstream, free_port
from training.chat import render_prompt
from training.config import TrainingConfig
from training.evaluation import compare_replies
from training.repliers import InProcessReplier, ModelServers, ServerReplier, choose_replier
from training.sampling import generate_replies
from training.trainer import add_lora

QUESTIONS = ["what is the capital of france ?", "what color is the sky ?", "say hello"]
MODEL_DIR = Path("/models/SmolLM2-135M-Instruct")


@pytest.fixture
def model_and_tokenizer(make_tiny_llama, make_tiny_tokenizer):
    config = TrainingConfig(lora_r=4, lora_alpha=8, min_steps=1, save_every_steps=0)
    return add_lora(make_tiny_llama(), config), make_tiny_tokenizer()


def _prompts(tokenizer) -> list[list[int]]:
    return [render_prompt(tokenizer, [{"role": "user", "content": q}]) for q in QUESTIONS]


def test_in_process_replies_are_cut_to_each_items_own_budget(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    prompts, budgets = _prompts(tokenizer), [2, 7, 4]
    eos = tokenizer.eos_token_id

    replies = InProcessReplier(eos, batch_size=3).greedy_replies(
        model, prompts, budgets, adapter_on=True
    )

    alone = [
        generate_replies(model, [p], eos_token_id=eos, max_new_tokens=b, temperature=None)[0]
        for p, b in zip(prompts, budgets, strict=True)
    ]
    assert replies == alone
    assert [len(reply) for reply in replies] == [2, 7, 4]  # the random model never says eos


def test_a_server_that_does_not_answer_hands_every_reply_to_the_fallback(
    model_and_tokenizer, tmp_path
):
    model, tokenizer = model_and_tokenizer
    eos = tokenizer.eos_token_id
    items = [{"context": [{"role": "user", "content": q}]} for q in QUESTIONS]
    with httpx.Client(timeout=2) as client:
        replier = ServerReplier(
            client,
            f"http://127.0.0.1:{free_port()}/v1",  # nothing listens there
            base_model="base",
            scratch_dir=tmp_path / "scratch",
            eos_token_id=eos,
            fallback=InProcessReplier(eos),
        )
        on_server = compare_replies(model, tokenizer, items, max_new_tokens=4, replier=replier)

    in_process = compare_replies(model, tokenizer, items, max_new_tokens=4)
    assert on_server == in_process
    assert replier.record["server_replies"] == 0
    assert replier.record["in_process_replies"] == 2 * len(items)  # base side and adapter side
    assert replier.record["error"].startswith("ConnectError")
    assert replier.record["reply_seconds"] > 0  # the fallback's replies count too
    assert not list((tmp_path / "scratch").glob("*"))  # no candidate left on disk


class _ServerOf(FakeUpstream):
    """Lists one served model the way vLLM does: its name and the directory it was started on."""

    def __init__(self, root: str) -> None:
        super().__init__()
        self.root = root

    async def app(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"].endswith("/models"):
            await self._json(send, 200, {"data": [{"id": "smol", "root": self.root}]})
        else:
            await super().app(scope, receive, send)


@pytest.fixture
def start_server():
    started = []

    def start(root: str) -> _ServerOf:
        started.append(_ServerOf(root).start())
        return started[-1]

    yield start
    for server in started:
        server.stop()


def _servers(urls: list[str], tmp_path) -> ModelServers:
    return ModelServers(
        urls=tuple(urls), served_model="smol", scratch_dir=tmp_path, name_prefix="eval-run1"
    )


def test_the_first_server_serving_the_base_model_answers_the_evaluation(start_server, tmp_path):
    silent = f"http://127.0.0.1:{free_port()}/v1"
    other_weights = start_server("/srv/models/tiny-base")  # "smol" there is another model
    same_weights = start_server("/srv/copies/SmolLM2-135M-Instruct")
    servers = _servers([silent, other_weights.url, same_weights.url], tmp_path)

    with httpx.Client(timeout=2) as client:
        replier, record = choose_replier(
            client, servers, model_dir=MODEL_DIR, base_model="SmolLM2", eos_token_id=2
        )

    assert isinstance(replier, ServerReplier)
    assert (replier.base_url, replier.base_model) == (same_weights.url, "smol")
    assert record["server"] == same_weights.url


def test_without_a_server_serving_the_base_model_this_process_evaluates(start_server, tmp_path):
    servers = _servers([start_server("/srv/models/tiny-base").url], tmp_path)

    with httpx.Client(timeout=2) as client:
        replier, record = choose_replier(
            client, servers, model_dir=MODEL_DIR, base_model="SmolLM2", eos_token_id=2
        )

    assert isinstance(replier, InProcessReplier)
    assert record == {"server": "", "error": "no model server serving the base model answered"}
