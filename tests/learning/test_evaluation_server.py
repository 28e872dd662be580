"""Which model server a run's evaluation asks: the first of the project's upstreams that
answers and serves the run's base model; else the worker answers it itself."""

from pathlib import Path

import httpx
import pytest
from django.conf import settings as django_settings

from reviewapp.learning.retrain import _evaluation_replier
from reviewapp.learning.runs import start_retrain
from tests.fake_upstream import FakeUpstream, free_port
from training.repliers import InProcessReplier, ServerReplier

pytestmark = pytest.mark.django_db
MODEL_DIR = Path("/models/SmolLM2-135M-Instruct")


class _Tokenizer:
    eos_token_id = 2


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


@pytest.fixture(autouse=True)
def operator_servers(settings):
    settings.MODEL_SERVERS = []  # restored after the test; _run_for lists the test's servers


def _run_for(project, upstreams: list[str]):
    django_settings.MODEL_SERVERS = upstreams  # the operator's servers: the project may use them
    project.served_model = "smol"
    project.settings = {**(project.settings or {}), "upstreams": upstreams}
    project.save()
    return start_retrain(project=project)


def test_the_first_upstream_serving_the_base_model_answers_the_evaluation(
    project, approved_target, start_server
):
    silent = f"http://127.0.0.1:{free_port()}/v1"
    other_weights = start_server("/srv/models/tiny-base")  # "smol" there is another model
    same_weights = start_server("/srv/copies/SmolLM2-135M-Instruct")
    run = _run_for(project, [silent, other_weights.url, same_weights.url])

    with httpx.Client(timeout=2) as client:
        replier, record = _evaluation_replier(run, MODEL_DIR, _Tokenizer(), client)

    assert isinstance(replier, ServerReplier)
    assert (replier.base_url, replier.base_model) == (same_weights.url, "smol")
    assert record["server"] == same_weights.url


def test_without_a_server_serving_the_base_model_the_worker_evaluates(
    project, approved_target, start_server
):
    run = _run_for(project, [start_server("/srv/models/tiny-base").url])

    with httpx.Client(timeout=2) as client:
        replier, record = _evaluation_replier(run, MODEL_DIR, _Tokenizer(), client)

    assert isinstance(replier, InProcessReplier)
    assert record == {"server": "", "error": "no model server serving the base model answered"}
