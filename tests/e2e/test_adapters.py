"""The adapter page's deploy buttons in a real browser: htmx swaps the deployment block in place,
including the model server's refusal, which htmx would otherwise drop as an error response.

Deploys talk to tests/fake_upstream.py, a FAKE model server, over real HTTP.
"""

import pytest
from playwright.sync_api import expect

from reviewapp.learning.models import ModelRoute
from reviewapp.traces.ingest import ingest_traces
from tests.e2e.conftest import sign_in
from tests.factories import make_trace
from tests.fake_upstream import FakeUpstream, free_port
from tests.learning.test_views_adapters import make_adapter

pytestmark = pytest.mark.slow


@pytest.fixture
def adapter(project):
    ingest_traces(project=project, raw_items=[make_trace("t-1")])
    return make_adapter(project, project.traces.get(), 1)


@pytest.fixture
def alice_page(context, page, live_server, alice):
    sign_in(context, alice, live_server)
    page.csp_errors = []
    page.on(
        "console",
        lambda message: (
            "Content Security Policy" in message.text and page.csp_errors.append(message.text)
        ),
    )
    return page


def test_a_canary_deploy_then_promote_updates_the_block_in_place(alice_page, adapter, project):
    server = FakeUpstream().start()
    project.upstream_url = server.url
    project.save()
    page = alice_page
    try:
        page.goto("/p/acme/adapters/1/")
        page.locator("#deployment input[type=number][name=share]").fill("25")
        page.locator("#deploy-canary").click()
        expect(page.locator("#deployment-state")).to_have_text("canary 25%")
        page.locator("#promote").click()
        expect(page.locator("#deployment-state")).to_have_text("primary 100%")
    finally:
        server.stop()
    route = ModelRoute.objects.get(project=project)
    assert (route.primary, route.canary) == ("acme-v1", "")
    assert page.url.endswith("/p/acme/adapters/1/")  # swapped, not navigated
    assert page.csp_errors == []


def test_a_model_server_that_is_down_shows_why_in_place(alice_page, adapter, project, monkeypatch):
    monkeypatch.setattr("training.deploy.time.sleep", lambda seconds: None)  # no backoff waits
    project.upstream_url = f"http://127.0.0.1:{free_port()}/v1"
    project.save()
    page = alice_page
    page.goto("/p/acme/adapters/1/")
    page.locator("#deploy-all").click()
    expect(page.locator("#deployment-error")).to_contain_text("routing is unchanged")
    expect(page.locator("#deployment-state")).to_have_text("not serving")
    assert not ModelRoute.objects.filter(project=project).exclude(primary="").exists()
    assert page.csp_errors == []
