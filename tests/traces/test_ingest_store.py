"""Storing a batch: through COPY and one INSERT ... ON CONFLICT on PostgreSQL, through the ORM
where COPY is missing (the embedded SQLite). Both paths keep the same contract."""

import pytest
from django.db import transaction

from reviewapp.traces import ingest
from reviewapp.traces.ingest import ingest_traces
from reviewapp.traces.models import Trace
from tests.factories import make_trace


@pytest.fixture(params=["copy", "orm"])
def store_path(request, monkeypatch):
    """Which insert path runs; "orm" is the one SQLite takes, run here on PostgreSQL."""
    if request.param == "orm":
        monkeypatch.setattr(ingest, "_insert_by_copy", ingest._insert_by_orm)
    return request.param


@pytest.fixture
def changed(monkeypatch) -> list[int]:
    """The trace ids handed to triage and embedding."""
    ids: list[int] = []
    monkeypatch.setattr(ingest, "after_traces_changed", ids.extend)
    return ids


def test_new_unchanged_conflicting_and_invalid_items_in_one_batch(project, store_path, changed):
    ingest_traces(project=project, raw_items=[make_trace("old"), make_trace("kept")])
    changed.clear()
    batch = [
        make_trace("new"),
        make_trace("old"),
        make_trace("kept", metadata={"changed": True}),
        {"external_id": "bad", "messages": []},
    ]
    results = ingest_traces(project=project, raw_items=batch)
    assert [(r.external_id, r.status) for r in results] == [
        ("new", 201), ("old", 200), ("kept", 409), ("bad", 422),
    ]  # fmt: skip
    assert "different content" in results[2].error
    assert "messages" in results[3].error
    assert project.traces.count() == 3
    assert project.traces.get(external_id="kept").metadata == {"customer": "c-42"}
    assert changed == [project.traces.get(external_id="new").pk]


def test_the_same_id_twice_in_a_batch_is_stored_once(project, store_path):
    results = ingest_traces(project=project, raw_items=[make_trace("a"), make_trace("a")])
    assert [r.status for r in results] == [201, 200]
    assert project.traces.filter(external_id="a").count() == 1


def test_several_batches_in_one_transaction(project, store_path):
    with transaction.atomic():
        for name in ("a", "b", "a"):
            ingest_traces(project=project, raw_items=[make_trace(name)])
    assert sorted(project.traces.values_list("external_id", flat=True)) == ["a", "b"]


def test_stored_rows_hold_every_column_as_the_orm_reads_it(project, store_path):
    ingest_traces(
        project=project,
        raw_items=[make_trace("a", tags=["slow"], started_at="2026-01-02T03:04:05Z")],
    )
    trace = Trace.objects.get(project=project, external_id="a")
    assert trace.body_json()["messages"] == make_trace("a")["messages"]
    assert trace.metadata == {"customer": "c-42"}
    assert (trace.reward, trace.success, trace.termination) == (1.0, True, "completed")
    assert trace.started_at.isoformat() == "2026-01-02T03:04:05+00:00"
    assert trace.tool_results == {"calculator": 1}
    assert list(trace.trace_tags.values_list("tag__name", flat=True)) == ["slow"]
