"""Similarity search through pgvector's HNSW index agrees with the numpy scan.

Not collected on its own (no test_ prefix): these need a PostgreSQL with pgvector, and
test_similarity_pgvector.py starts one and runs this file against it.
"""

import importlib

import numpy as np
import pytest
from django.apps import apps
from django.db import connection
from django.db.models import Q

from reviewapp.monitors import embeddings as similarity
from reviewapp.monitors import similarity as service
from reviewapp.monitors.models import TraceEmbedding, TraceVector
from reviewapp.traces.models import Tag, TraceTag
from tests.factories import make_trace
from tests.monitors.test_similarity import (
    SEARCH_TIMEOUTS,
    WRONG_SUMS,
    store,
    timeout_trace,
    wrong_sum_trace,
)

# How many of the newest vectors the numpy path used to read before it gave up (it was 20,000
# in production); the traces here outnumber it, and the best match is older than all of them.
OLD_WINDOW = 20


def random_unit_vectors(count: int, seed: int) -> np.ndarray:
    vectors = np.random.default_rng(seed).standard_normal((count, similarity.DIMENSIONS))
    return (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)


def store_vectors(traces: list, vectors: np.ndarray) -> None:
    """Through the service's own write path: the bytes and the pgvector column together."""
    service._store_vectors(traces, vectors, {trace.pk: "known vector" for trace in traces})


@pytest.fixture
def traces_with_the_oldest_nearest(project):
    """60 traces; the query is the newest, and the oldest is the one most like it."""
    traces = sorted(
        store(project, [make_trace(f"t-{i:02}") for i in range(60)]).values(),
        key=lambda trace: trace.pk,
    )
    vectors = random_unit_vectors(len(traces), seed=3)
    oldest, query = vectors[0], vectors[-1]
    blend = 0.9 * query + 0.1 * oldest
    vectors[0] = blend / np.linalg.norm(blend)
    store_vectors(traces, vectors)
    return traces


def hnsw_index_definition() -> str | None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexdef FROM pg_indexes WHERE indexname = 'embedding_hnsw' "
            "AND tablename = 'reviewapp_traceembedding'"
        )
        row = cursor.fetchone()
    return row[0] if row else None


def test_the_migration_added_the_vector_column_with_an_hnsw_cosine_index(db):
    assert "USING hnsw (embedding vector_cosine_ops)" in hnsw_index_definition()
    assert service.vector_search_available()


def embedding_column_exists() -> bool:
    with connection.cursor() as cursor:
        columns = connection.introspection.get_table_description(cursor, TraceVector._meta.db_table)
    return "embedding" in {column.name for column in columns}


def test_the_migration_copies_vectors_stored_before_it_into_the_column(project):
    traces = list(store(project, [make_trace("a"), make_trace("b")]).values())
    vectors = random_unit_vectors(2, seed=7)
    store_vectors(traces, vectors)
    migration = importlib.import_module("reviewapp.migrations.0016_trace_vector")
    with connection.cursor() as cursor:
        # The rows' foreign keys are checked now, not at the test's end: ALTER TABLE refuses
        # to run with checks pending.
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
    with connection.schema_editor() as editor:
        migration.drop_vector_column(apps, editor)
    # The table as it was before 0016: the bytes only.
    assert not embedding_column_exists() and hnsw_index_definition() is None

    with connection.schema_editor() as editor:
        migration.add_vector_column(apps, editor)

    for trace, vector in zip(traces, vectors, strict=True):
        np.testing.assert_allclose(
            TraceVector.objects.get(trace_id=trace.pk).embedding, vector, rtol=1e-6
        )
    assert "USING hnsw (embedding vector_cosine_ops)" in hnsw_index_definition()


def test_stored_vectors_fill_the_pgvector_column(project):
    trace = store(project, [make_trace("t")])["t"]
    vector = random_unit_vectors(1, seed=1)

    store_vectors([trace], vector)

    row = TraceVector.objects.get(trace_id=trace.pk)
    np.testing.assert_allclose(row.embedding, vector[0], rtol=1e-6)
    assert TraceEmbedding.objects.get(trace=trace).vector == similarity.to_bytes(vector[0])


def test_the_index_finds_the_neighbours_numpy_finds_including_the_oldest_trace(
    project, traces_with_the_oldest_nearest, monkeypatch
):
    traces = traces_with_the_oldest_nearest
    newest, oldest = traces[-1], traces[0]
    query = service._vector_of(newest)
    # Several chunks: the scan keeps its best across them.
    monkeypatch.setattr(similarity, "READ_CHUNK", 7)

    indexed = service._nearest_indexed(project, query, 10, other_than=newest.pk)
    scanned = service._nearest_scanned(project, query, 10, other_than=newest.pk)

    assert [trace_id for trace_id, _ in indexed] == [trace_id for trace_id, _ in scanned]
    np.testing.assert_allclose(
        [score for _, score in indexed], [score for _, score in scanned], atol=1e-5
    )
    newest_window = {trace.pk for trace in traces[-OLD_WINDOW:]}
    assert indexed[0][0] == oldest.pk and oldest.pk not in newest_window
    similar = service.similar_traces(trace=newest, limit=10)
    assert [item.trace.pk for item in similar] == [trace_id for trace_id, _ in indexed]


def test_the_query_is_answered_by_the_hnsw_index(project, traces_with_the_oldest_nearest):
    newest = traces_with_the_oldest_nearest[-1]
    nearest_first = service._indexed_query(
        project, service._vector_of(newest), other_than=newest.pk, among=None
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE reviewapp_traceembedding")
        # At 60 rows reading and sorting them all is cheaper; production tables are not 60 rows.
        cursor.execute("SET enable_seqscan = off")
        cursor.execute("SET enable_sort = off")
        try:
            plan = nearest_first[:10].explain()
        finally:
            cursor.execute("RESET enable_seqscan")
            cursor.execute("RESET enable_sort")

    assert "Index Scan using embedding_hnsw" in plan


def test_suggested_tags_through_the_index_filter_to_reviewed_traces(
    project, bob, traces_with_the_oldest_nearest
):
    traces = traces_with_the_oldest_nearest
    newest = traces[-1]
    slow = Tag.objects.create(project=project, name="slow")
    for trace in traces[:OLD_WINDOW:3]:
        TraceTag.objects.create(trace=trace, tag=slow, reviewer=bob)
    reviewed = Q(pk__in=TraceTag.objects.filter(reviewer__isnull=False).values("trace_id"))
    query = service._vector_of(newest)

    indexed = service._nearest_indexed(project, query, 5, other_than=newest.pk, among=reviewed)
    scanned = service._nearest_scanned(project, query, 5, other_than=newest.pk, among=reviewed)

    assert [trace_id for trace_id, _ in indexed] == [trace_id for trace_id, _ in scanned]
    assert len(indexed) == 5 and indexed[0][0] == traces[0].pk
    suggestions = service.suggested_tags(trace=newest, neighbours=5, min_score=0)
    assert [s.tag.name for s in suggestions] == ["slow"]


def test_another_projects_vectors_are_never_neighbours(project, other_project):
    ours = store(project, [make_trace("ours"), make_trace("mine")])
    theirs = store(other_project, [make_trace("theirs")])["theirs"]
    vector = random_unit_vectors(1, seed=5)
    store_vectors([ours["ours"], theirs], np.concatenate([vector, vector]))
    store_vectors([ours["mine"]], -vector)

    similar = service.similar_traces(trace=ours["ours"], limit=5)

    assert [item.trace.external_id for item in similar] == ["mine"]


def test_embedded_traces_rank_the_same_failure_kind_first_through_the_index(project):
    traces = store(
        project,
        [timeout_trace(f"timeout-{i}", q) for i, q in enumerate(SEARCH_TIMEOUTS)]
        + [wrong_sum_trace(f"sum-{i}", q) for i, q in enumerate(WRONG_SUMS)],
    )
    assert service.embed_traces(trace_ids=[trace.pk for trace in traces.values()]) == 8
    query_trace = traces["timeout-0"]
    query = service._vector_of(query_trace)

    similar = service.similar_traces(trace=query_trace, limit=7)

    ranked = [item.trace.external_id.split("-")[0] for item in similar]
    assert ranked == ["timeout"] * 3 + ["sum"] * 4
    scanned = service._nearest_scanned(project, query, 7, other_than=query_trace.pk)
    assert [item.trace.pk for item in similar] == [trace_id for trace_id, _ in scanned]
