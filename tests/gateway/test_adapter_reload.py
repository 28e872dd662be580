"""A model server restarted after a deploy has forgotten the adapter: the gateway loads it again
from the adapter store on that server and the harness's call through the alias succeeds.

The model server is FAKE (tests/fake_upstream.py over real HTTP) and forgets like vLLM does."""

import orjson
import pytest
from asgiref.sync import sync_to_async
from django.test import AsyncClient

from reviewapp.gateway.recorder import recorder
from reviewapp.gateway.routing import forget_cached_routes
from reviewapp.learning.deploy import deploy_adapter
from reviewapp.learning.models import Adapter
from reviewapp.projects.services import create_api_key, create_project
from tests.fake_upstream import FakeUpstream

pytestmark = pytest.mark.django_db(transaction=True)  # the recorder writes from its own thread


class ForgetfulUpstream(FakeUpstream):
    """Serves the base and the adapters loaded since its last `restart()`; any other model name
    is answered 404 "does not exist", as vLLM answers it."""

    BASE = "SmolLM2-135M-Instruct"

    def __init__(self) -> None:
        super().__init__()
        self.loaded: set[str] = set()

    def restart(self) -> None:
        self.loaded.clear()

    async def app(self, scope, receive, send):
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        payload = orjson.loads(body) if body else {}
        self.requests.append({"path": scope["path"], "headers": {}, "body": payload})
        if scope["path"].endswith("/load_lora_adapter"):
            self.loaded.add(payload["lora_name"])
            await self._json(send, 200, {})
        elif scope["path"].endswith("/models"):
            models = [{"id": name} for name in [self.BASE, *sorted(self.loaded)]]
            await self._json(send, 200, {"object": "list", "data": models})
        elif payload.get("model") not in {self.BASE, *self.loaded}:
            error = {
                "message": f"The model `{payload.get('model')}` does not exist.",
                "type": "NotFoundError",
                "param": "model",
                "code": 404,
            }
            await self._json(send, 404, {"error": error})
        elif payload.get("stream"):
            await self._stream(send, payload)
        else:
            await self._json(send, 200, self._completion(payload))


@pytest.fixture
def server():
    upstream = ForgetfulUpstream().start()
    yield upstream
    upstream.stop()


@sync_to_async
def deployed_key(server: ForgetfulUpstream) -> str:
    forget_cached_routes()
    project = create_project(slug="shop", upstream_url=server.url, served_model="shop-agent")
    project.upstream_model = ForgetfulUpstream.BASE
    project.save()
    adapter = Adapter.objects.create(
        project=project, version=1, name="shop-v1", path="/adapters/shop-v1", base_model="b",
        checksum="c",
    )  # fmt: skip
    deploy_adapter(adapter=adapter)
    return create_api_key(project=project)[1]


def chat(key: str, *, stream: bool = False):
    body = {"model": "shop-agent", "messages": [{"role": "user", "content": "hi"}]}
    return AsyncClient().post(
        "/v1/chat/completions",
        orjson.dumps({**body, "stream": stream}),
        content_type="application/json",
        headers={"Authorization": f"Bearer {key}"},
    )


def loads(server: FakeUpstream) -> list[dict]:
    return [r["body"] for r in server.requests if r["path"].endswith("/load_lora_adapter")]


async def test_a_restarted_server_gets_the_deployed_adapter_again_on_the_first_call(server):
    key = await deployed_key(server)
    server.restart()

    response = await chat(key)

    assert response.status_code == 200
    assert server.requests[-1]["body"]["model"] == "shop-v1"
    assert loads(server)[-1] == {"lora_name": "shop-v1", "lora_path": "/adapters/shop-v1"}
    assert recorder.wait_until_idle(10)


async def test_a_streaming_call_also_reloads_the_adapter(server):
    key = await deployed_key(server)
    server.restart()

    response = await chat(key, stream=True)
    content = b"".join([chunk async for chunk in response.streaming_content])

    assert response.status_code == 200
    assert b"data: [DONE]" in content
    assert server.requests[-1]["body"]["model"] == "shop-v1"
    assert loads(server)[-1] == {"lora_name": "shop-v1", "lora_path": "/adapters/shop-v1"}
    assert recorder.wait_until_idle(10)
