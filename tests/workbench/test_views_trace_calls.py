"""The trace page shows each gateway call's finish reason, and why an error trace failed."""

from datetime import UTC, datetime

from django.test import Client

from reviewapp.gateway.calls import RecordedCall, record_model_call
from reviewapp.traces.ingest import ingest_traces
from reviewapp.traces.models import Trace
from tests.factories import make_trace

QUESTION = [{"role": "user", "content": "Summarise the report"}]
ANSWER = {"role": "assistant", "content": "Done."}


def record(project, *, response, status, termination, error="", messages=QUESTION):
    record_model_call(
        RecordedCall(
            project_id=project.pk,
            trace_id_header="episode-1",
            requested_model="shop-agent",
            upstream_model="base-model",
            adapter_version="",
            upstream_url="http://model.invalid/v1",
            stream=False,
            request={"model": "shop-agent", "messages": messages},
            response=response,
            status_code=status,
            termination=termination,
            error=error,
            started_at=datetime(2026, 12, 1, tzinfo=UTC),
            latency_ms=120.0,
            time_to_first_token_ms=None,
        )
    )
    return Trace.objects.get(project=project, external_id="episode-1")


def page(user, trace) -> str:
    client = Client()
    client.force_login(user)
    return client.get(f"/p/acme/traces/{trace.pk}/").content.decode()


def test_each_call_shows_its_finish_reason(bob, project):
    cut = {
        "choices": [{"message": {"role": "assistant", "content": "The"}, "finish_reason": "length"}]
    }
    trace = record(project, response=cut, status=200, termination="truncated")
    html = page(bob, trace)
    assert 'id="model-calls"' in html
    assert '<span class="badge truncated">length</span>' in html
    assert '<span class="badge truncated">truncated</span>' in html


def test_an_error_trace_shows_the_status_code_and_error_message(bob, project):
    message = '{"error": {"message": "This model\'s maximum context length is 2048 tokens"}}'
    trace = record(project, response=None, status=400, termination="error", error=message)
    assert trace.termination == "error"
    html = page(bob, trace)
    head = html[html.index('id="call-error"') :]
    assert "HTTP 400" in head[:200]
    assert "maximum context length is 2048 tokens" in head[:600]


def test_a_trace_without_failed_calls_shows_no_error_line(bob, project):
    done = {
        "choices": [{"message": {"role": "assistant", "content": "Done."}, "finish_reason": "stop"}]
    }
    trace = record(project, response=done, status=200, termination="completed")
    html = page(bob, trace)
    assert 'id="call-error"' not in html
    assert ">stop</span>" in html


def turn_html(html: str, index: int) -> str:
    start = html.index(f'id="turn-{index}"')
    return html[start : html.index("</article>", start)]


def test_the_turn_cut_at_max_tokens_is_marked_on_the_page(bob, project):
    cut = {
        "choices": [{"message": {"role": "assistant", "content": "The"}, "finish_reason": "length"}]
    }
    trace = record(project, response=cut, status=200, termination="truncated")
    html = page(bob, trace)
    assert "cut at max_tokens" in turn_html(html, 1)
    assert "cut at max_tokens" not in turn_html(html, 0)


def test_a_pushed_truncated_trace_marks_its_last_assistant_turn(bob, project):
    item = make_trace("pushed", termination="truncated")
    ingest_traces(project=project, raw_items=[item])
    trace = project.traces.get()
    html = page(bob, trace)
    last = len(item["messages"]) - 1
    assert "cut at max_tokens" in turn_html(html, last)
    assert html.count("cut at max_tokens</span>") == 1


def test_a_completed_trace_marks_no_turn_cut(bob, project):
    ingest_traces(project=project, raw_items=[make_trace("done")])
    assert "cut at max_tokens" not in page(bob, project.traces.get())


def test_an_empty_assistant_reply_says_so(bob, project):
    item = make_trace("silent")
    item["messages"][-1]["content"] = ""
    ingest_traces(project=project, raw_items=[item])
    html = page(bob, project.traces.get())
    assert "(empty reply)" in turn_html(html, len(item["messages"]) - 1)
    assert html.count("(empty reply)") == 1
