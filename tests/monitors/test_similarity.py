"""Embeddings with the bundled sentence model, and what they are used for."""

from io import StringIO

import numpy as np
import pytest
from django.core.management import call_command

from reviewapp.monitors import embeddings as similarity
from reviewapp.monitors import similarity as service
from reviewapp.monitors.models import TraceEmbedding
from reviewapp.monitors.similarity import apply_feedback_to_traces
from reviewapp.review.feedback import record_feedback
from reviewapp.review.models import CopiedFeedback, Feedback
from reviewapp.traces.ingest import ingest_traces
from reviewapp.traces.models import Tag, Trace, TraceTag
from tests.factories import make_trace

SEARCH_TIMEOUTS = [
    "Find flights from Paris to Rome next Tuesday.",
    "Look up train times from Berlin to Munich tomorrow.",
    "Search for hotels in Lisbon for the weekend.",
    "Find a bus from Madrid to Valencia on Friday.",
]
WRONG_SUMS = [
    "What is 17 plus 25?",
    "Add 340 and 129 for me.",
    "How much is 48 + 77?",
    "Compute the sum of 905 and 16.",
]


def timeout_trace(external_id: str, question: str) -> dict:
    return make_trace(
        external_id,
        termination="tool_error",
        messages=[
            {"role": "user", "content": question},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "search", "arguments": "{}"},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "Error: travel search timed out"},
            {"role": "assistant", "content": "Sorry, I could not reach the booking service."},
        ],
        tools=[{"type": "function", "function": {"name": "search"}}],
    )


def wrong_sum_trace(external_id: str, question: str) -> dict:
    return make_trace(
        external_id,
        outcome={"success": False},
        messages=[
            {"role": "user", "content": question},
            {"role": "assistant", "content": "The answer is 12, I counted on my fingers."},
        ],
        tools=[],
    )


def store(project, items: list[dict]) -> dict[str, Trace]:
    ingest_traces(project=project, raw_items=items)
    return {trace.external_id: trace for trace in project.traces.all()}


def put_vectors(traces: dict[str, Trace], vectors: dict[str, list[float]]) -> None:
    """Stored vectors made by hand: the directions decide who is similar to whom."""
    for external_id, values in vectors.items():
        vector = np.zeros(similarity.DIMENSIONS, dtype=np.float32)
        vector[: len(values)] = values
        vector /= np.linalg.norm(vector)
        trace = traces[external_id]
        TraceEmbedding.objects.create(
            project_id=trace.project_id,
            trace=trace,
            model_name=similarity.MODEL_NAME,
            vector=similarity.to_bytes(vector),
            content_hash="by hand",
        )


def test_compact_text_holds_question_failing_tool_answer_and_feedback():
    messages = timeout_trace("t", "Find flights to Rome.")["messages"]

    text = similarity.compact_text(
        messages, termination="tool_error", feedback_texts=("Retry the search once.",)
    )

    assert text.splitlines() == [
        "[tool_error]",
        "Find flights to Rome.",
        "Tool failed: Error: travel search timed out",
        "Answer: Sorry, I could not reach the booking service.",
        "Feedback: Retry the search once.",
    ]


def test_kmeans_separates_two_groups_of_vectors():
    rng = np.random.default_rng(1)
    centres = np.eye(2, 8, dtype=np.float32)
    points = np.concatenate([centre + 0.1 * rng.standard_normal((20, 8)) for centre in centres])
    points = (points / np.linalg.norm(points, axis=1, keepdims=True)).astype(np.float32)

    labels, _ = similarity.kmeans(points, 2)

    assert len(set(labels[:20])) == 1 and len(set(labels[20:])) == 1
    assert labels[0] != labels[20]


def test_unchanged_trace_is_not_embedded_again(project, monkeypatch):
    embedded: list[str] = []

    def fake_embed(texts: list[str]) -> np.ndarray:
        embedded.extend(texts)
        return np.ones((len(texts), similarity.DIMENSIONS), dtype=np.float32)

    monkeypatch.setattr(similarity, "embed_texts", fake_embed)
    trace = store(project, [make_trace("t")])["t"]

    assert service.embed_traces(trace_ids=[trace.pk]) == 1
    assert service.embed_traces(trace_ids=[trace.pk]) == 0
    record_feedback(trace=trace, text="Show the working.")
    assert service.embed_traces(trace_ids=[trace.pk]) == 1
    assert "Feedback: Show the working." in embedded[-1]
    assert TraceEmbedding.objects.filter(trace=trace).count() == 1


@pytest.mark.slow
def test_the_real_model_puts_paraphrases_closer_than_unrelated_texts():
    vectors = similarity.embed_texts(
        [
            "The search tool timed out before returning any flights.",
            "Flight search failed: the tool took too long to answer.",
            "The assistant added two numbers and got the sum wrong.",
        ]
    )

    assert vectors.shape == (3, similarity.DIMENSIONS)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
    paraphrase, unrelated = vectors[0] @ vectors[1], vectors[0] @ vectors[2]
    assert paraphrase > unrelated + 0.2


@pytest.mark.slow
def test_clustering_separates_two_failure_kinds_and_more_like_this_ranks_the_same_kind_first(
    project,
):
    traces = store(
        project,
        [timeout_trace(f"timeout-{i}", q) for i, q in enumerate(SEARCH_TIMEOUTS)]
        + [wrong_sum_trace(f"sum-{i}", q) for i, q in enumerate(WRONG_SUMS)],
    )
    assert service.embed_traces(trace_ids=[trace.pk for trace in traces.values()]) == 8

    clusters = service.failure_clusters(project=project, clusters=2).clusters

    kinds = [{trace.external_id.split("-")[0] for trace in c.examples} for c in clusters]
    assert sorted(len(c.examples) for c in clusters) == [4, 4]
    assert sorted(map(sorted, kinds)) == [["sum"], ["timeout"]]
    similar = service.similar_traces(trace=traces["timeout-0"], limit=7)
    ranked = [item.trace.external_id.split("-")[0] for item in similar]
    assert ranked == ["timeout"] * 3 + ["sum"] * 4


def test_feedback_is_applied_only_to_the_confirmed_traces(project, bob):
    traces = store(project, [make_trace(name) for name in ("source", "confirmed", "unticked")])
    put_vectors(traces, {"source": [1, 0], "confirmed": [0.9, 0.1], "unticked": [0.95, 0.05]})
    feedback, _ = record_feedback(
        trace=traces["source"],
        text="Say which tool you used.",
        turn=4,
        checks=[{"kind": "regex", "value": "calculator"}],
        author="alice",
    )

    applied = apply_feedback_to_traces(
        feedback=feedback, traces=[traces["confirmed"]], reviewer=bob
    )

    assert [copy.trace for copy in applied.created] == [traces["confirmed"]]
    copy = applied.created[0]
    assert (copy.text, copy.turn, copy.author, copy.reviewer) == (
        "Say which tool you used.",
        None,
        "bob",
        bob,
    )
    assert copy.checks == feedback.checks
    origin = CopiedFeedback.objects.get(feedback=copy)
    assert origin.source == feedback and origin.confirmed_by == bob
    assert origin.similarity == pytest.approx(0.9 / np.hypot(0.9, 0.1), abs=1e-5)
    assert not Feedback.objects.filter(trace=traces["unticked"]).exists()
    again = apply_feedback_to_traces(feedback=feedback, traces=[traces["confirmed"]], reviewer=bob)
    assert again.created == [] and len(again.skipped) == 1
    assert Feedback.objects.filter(trace=traces["confirmed"]).count() == 1


def test_feedback_is_not_applied_to_another_projects_trace(project, other_project, bob):
    source = store(project, [make_trace("source")])["source"]
    ingest_traces(project=other_project, raw_items=[make_trace("theirs")])
    theirs = other_project.traces.get()
    feedback, _ = record_feedback(trace=source, text="Be brief.")

    applied = apply_feedback_to_traces(feedback=feedback, traces=[theirs], reviewer=bob)

    assert applied.created == []
    assert not Feedback.objects.filter(trace=theirs).exists()


def test_suggested_tags_come_from_the_nearest_reviewed_traces(project, bob):
    traces = store(project, [make_trace(name) for name in ("new", "near", "near2", "far", "bot")])
    put_vectors(
        traces,
        {"new": [1, 0], "near": [0.95, 0.1], "near2": [0.9, 0.2], "far": [0, 1], "bot": [1, 0]},
    )
    slow, rude, spam = (Tag.objects.create(project=project, name=n) for n in ("slow", "rude", "x"))
    TraceTag.objects.create(trace=traces["near"], tag=slow, reviewer=bob)
    TraceTag.objects.create(trace=traces["near2"], tag=slow, reviewer=bob)
    TraceTag.objects.create(trace=traces["far"], tag=rude, reviewer=bob)
    TraceTag.objects.create(trace=traces["bot"], tag=spam)  # a machine's tag is no review

    suggestions = service.suggested_tags(trace=traces["new"], neighbours=3)

    assert [s.tag.name for s in suggestions] == ["slow"]
    assert suggestions[0].votes == 2
    assert 0.9 < suggestions[0].score <= 1
    assert suggestions[0].neighbours == 2  # "far" points elsewhere: not a similar trace


def test_a_suggestion_says_how_many_reviewed_neighbours_were_asked(project, bob):
    traces = store(project, [make_trace(name) for name in ("new", "a", "b", "c")])
    put_vectors(traces, {"new": [1, 0], "a": [0.9, 0.1], "b": [0.8, 0.2], "c": [0.7, 0.3]})
    slow, rude = (Tag.objects.create(project=project, name=n) for n in ("slow", "rude"))
    TraceTag.objects.create(trace=traces["a"], tag=slow, reviewer=bob)
    for name in ("b", "c"):
        TraceTag.objects.create(trace=traces[name], tag=rude, reviewer=bob)

    suggestions = service.suggested_tags(trace=traces["new"])

    assert [(s.tag.name, s.votes, s.neighbours) for s in suggestions] == [
        ("rude", 2, 3),
        ("slow", 1, 3),
    ]


def test_embed_traces_command_fills_in_what_is_missing(project, monkeypatch):
    monkeypatch.setattr(
        similarity,
        "embed_texts",
        lambda texts: np.ones((len(texts), similarity.DIMENSIONS), dtype=np.float32),
    )
    store(project, [make_trace(f"t-{i}") for i in range(3)])
    service.embed_traces(trace_ids=[project.traces.order_by("id").first().pk])
    out = StringIO()

    call_command("embed_traces", "acme", stdout=out, stderr=StringIO())

    assert out.getvalue().strip() == "embedded 2, unchanged 1"
    assert TraceEmbedding.objects.count() == 3


def test_more_like_this_compares_every_trace_not_only_the_newest(project, monkeypatch):
    # Vectors are read two at a time here: the oldest trace is four reads behind the newest.
    monkeypatch.setattr(similarity, "READ_CHUNK", 2)
    traces = store(project, [make_trace(f"t-{i}") for i in range(9)])
    put_vectors(
        traces,
        {"t-8": [1, 0], "t-0": [0.99, 0.05]} | {f"t-{i}": [1, i] for i in range(1, 8)},
    )

    similar = service.similar_traces(trace=traces["t-8"], limit=4)

    assert [item.trace.external_id for item in similar] == ["t-0", "t-1", "t-2", "t-3"]
    assert [item.score for item in similar] == sorted(
        (item.score for item in similar), reverse=True
    )


def test_the_clusters_say_when_older_failing_traces_were_left_out(project, monkeypatch):
    traces = store(project, [wrong_sum_trace(f"sum-{i}", q) for i, q in enumerate(WRONG_SUMS)])
    put_vectors(traces, {f"sum-{i}": [1, 0.1 * i] for i in range(4)})
    monkeypatch.setattr(similarity, "MAX_CLUSTERED", 3)

    grouped = service.failure_clusters(project=project, clusters=1)

    assert grouped.older_left_out
    assert {trace.external_id for trace in grouped.clusters[0].examples} == {
        "sum-1",
        "sum-2",
        "sum-3",
    }
    monkeypatch.setattr(similarity, "MAX_CLUSTERED", 4)
    everything = service.failure_clusters(project=project, clusters=1)
    assert not everything.older_left_out and everything.clusters[0].size == 4
