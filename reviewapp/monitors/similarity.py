"""Trace embeddings in the database, and what they are for: similar traces, failure clusters,
suggested tags, and a feedback copied onto the traces a reviewer confirmed alike (with how alike
they are).

Every trace of a project is compared. Where the database has pgvector (migration 0016 adds the
`embedding` column and its HNSW index when it can), PostgreSQL finds the nearest vectors itself;
elsewhere (SQLite, a PostgreSQL without the extension) numpy reads all of the project's vectors,
similarity.READ_CHUNK at a time. Clustering reads the newest similarity.MAX_CLUSTERED failing
traces and says when there were more.
"""

from collections import Counter, defaultdict
from dataclasses import dataclass

import numpy as np
from django.db import connection, transaction
from django.db.models import Exists, OuterRef, Q
from pgvector.django import CosineDistance

from reviewapp.monitors import embeddings as similarity
from reviewapp.monitors.models import TraceEmbedding, TraceVector
from reviewapp.projects.models import Project
from reviewapp.review.feedback import FeedbackError, record_feedback
from reviewapp.review.models import CopiedFeedback, Feedback
from reviewapp.traces.models import Tag, Termination, Trace, TraceTag

# Traces embedded per forward batch group and per transaction.
EMBED_CHUNK = 256


def _compact_texts(traces: list[Trace]) -> dict[int, str]:
    feedback: dict[int, list[str]] = defaultdict(list)
    for trace_id, text in (
        Feedback.objects.filter(trace__in=traces).order_by("id").values_list("trace_id", "text")
    ):
        feedback[trace_id].append(text)
    return {
        trace.pk: similarity.compact_text(
            trace.body_json()["messages"],
            termination=trace.termination,
            feedback_texts=tuple(feedback[trace.pk]),
        )
        for trace in traces
    }


def embed_traces(*, trace_ids: list[int]) -> int:
    """Embed the traces whose compact text changed since their stored vector; returns how many.

    The model runs outside any transaction; each chunk's vectors are then written in one.
    """
    embedded = 0
    for start in range(0, len(trace_ids), EMBED_CHUNK):
        chunk = list(
            Trace.objects.filter(pk__in=trace_ids[start : start + EMBED_CHUNK]).only(
                "id", "project_id", "body", "recording", "termination"
            )
        )
        texts = _compact_texts(chunk)
        hashes = {trace_id: similarity.text_hash(text) for trace_id, text in texts.items()}
        stored = dict(
            TraceEmbedding.objects.filter(
                trace__in=chunk, model_name=similarity.MODEL_NAME
            ).values_list("trace_id", "content_hash")
        )
        todo = [trace for trace in chunk if stored.get(trace.pk) != hashes[trace.pk]]
        if not todo:
            continue
        vectors = similarity.embed_texts([texts[trace.pk] for trace in todo])
        _store_vectors(todo, vectors, hashes)
        embedded += len(todo)
    return embedded


@transaction.atomic
def _store_vectors(traces: list[Trace], vectors: np.ndarray, hashes: dict[int, str]) -> None:
    rows = TraceEmbedding.objects.bulk_create(
        [
            TraceEmbedding(
                project_id=trace.project_id,
                trace_id=trace.pk,
                model_name=similarity.MODEL_NAME,
                vector=similarity.to_bytes(vector),
                content_hash=hashes[trace.pk],
            )
            for trace, vector in zip(traces, vectors, strict=True)
        ],
        update_conflicts=True,
        unique_fields=["trace", "model_name"],
        update_fields=["vector", "content_hash", "updated_at"],
    )
    if vector_search_available():
        # PostgreSQL returns every upserted row's id, so the column is filled by primary key.
        TraceVector.objects.bulk_update(
            [
                TraceVector(pk=row.pk, embedding=vector)
                for row, vector in zip(rows, vectors, strict=True)
            ],
            ["embedding"],
        )


# Per database (alias, name, host, port): None where it has no `embedding` column, else
# whether its pgvector filters during the index scan (0.8+: `hnsw.iterative_scan`).
_vector_columns: dict[tuple, bool | None] = {}


def _iterative_scan() -> bool | None:
    settings = connection.settings_dict
    key = (connection.alias, settings["NAME"], settings.get("HOST"), settings.get("PORT"))
    if key not in _vector_columns:
        _vector_columns[key] = None
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT extversion FROM pg_extension WHERE extname = 'vector' AND EXISTS ("
                    "SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema()"
                    " AND table_name = %s AND column_name = 'embedding')",
                    [TraceVector._meta.db_table],
                )
                row = cursor.fetchone()
            if row:
                major, minor = (int(part) for part in row[0].split(".")[:2])
                _vector_columns[key] = (major, minor) >= (0, 8)
    return _vector_columns[key]


def vector_search_available() -> bool:
    """Whether this database holds the vectors in a pgvector column with an HNSW index."""
    return _iterative_scan() is not None


def _embedding_rows(project: Project, trace_filter: Q | None, other_than: int | None = None):
    """The project's stored vectors, newest trace first, optionally filtered by trace."""
    rows = TraceEmbedding.objects.filter(project=project, model_name=similarity.MODEL_NAME)
    if trace_filter is not None:
        rows = rows.filter(trace__in=Trace.objects.filter(trace_filter))
    if other_than is not None:
        rows = rows.exclude(trace_id=other_than)
    return rows.order_by("-trace_id").values_list("trace_id", "vector")


def _as_matrix(pairs: list[tuple[int, bytes]]) -> tuple[np.ndarray, np.ndarray]:
    ids = np.array([trace_id for trace_id, _ in pairs], dtype=np.int64)
    return ids, similarity.from_bytes([vector for _, vector in pairs])


def _vector_chunks(project: Project, trace_filter: Q | None, other_than: int):
    """Every (trace ids, vectors) of the project, similarity.READ_CHUNK rows at a time."""
    pairs = []
    rows = _embedding_rows(project, trace_filter, other_than)
    for pair in rows.iterator(chunk_size=similarity.READ_CHUNK):
        pairs.append(pair)
        if len(pairs) == similarity.READ_CHUNK:
            yield _as_matrix(pairs)
            pairs = []
    if pairs:
        yield _as_matrix(pairs)


def _nearest_scanned(
    project: Project, query: np.ndarray, k: int, *, other_than: int, among: Q | None = None
) -> list[tuple[int, float]]:
    """(trace id, cosine) of the k nearest, best first: numpy over all the project's vectors."""
    chunks = _vector_chunks(project, among, other_than)
    ids, scores = similarity.nearest_in_chunks(chunks, query, k)
    return [(int(trace_id), float(score)) for trace_id, score in zip(ids, scores, strict=True)]


# Candidates the HNSW scan keeps (pgvector's default is 40); at least as many as are asked for.
EF_SEARCH = 100


@transaction.atomic
def _nearest_indexed(
    project: Project, query: np.ndarray, k: int, *, other_than: int, among: Q | None = None
) -> list[tuple[int, float]]:
    """(trace id, cosine) of the k nearest, best first, found by PostgreSQL's HNSW index."""
    if k <= 0:
        return []
    with connection.cursor() as cursor:
        cursor.execute("SELECT set_config('hnsw.ef_search', %s, true)", [str(max(EF_SEARCH, k))])
        if _iterative_scan():
            # Filters (project, reviewed, not itself) apply during the scan, which goes on
            # until k rows pass them, in exact distance order; it gives up after
            # hnsw.max_scan_tuples (20,000) rows, so a filter that very few pass may get fewer.
            cursor.execute("SET LOCAL hnsw.iterative_scan = strict_order")
    rows = _indexed_query(project, query, other_than=other_than, among=among)
    rows = rows.values_list("trace_id", "distance")
    return [(trace_id, 1 - distance) for trace_id, distance in rows[:k]]


def _indexed_query(project: Project, query: np.ndarray, *, other_than: int, among: Q | None):
    """The project's vectors, nearest `query` first: ORDER BY cosine distance, as HNSW serves."""
    rows = TraceVector.objects.filter(
        project_id=project.pk, model_name=similarity.MODEL_NAME, embedding__isnull=False
    )
    rows = rows.exclude(trace_id=other_than)
    if among is not None:
        rows = rows.filter(trace_id__in=Trace.objects.filter(among).values("pk"))
    return rows.annotate(distance=CosineDistance("embedding", query)).order_by("distance")


def _nearest(
    project: Project, query: np.ndarray, k: int, *, other_than: int, among: Q | None = None
) -> list[tuple[int, float]]:
    """(trace id, cosine) of the k traces nearest `query` but `other_than`, among those given."""
    search = _nearest_indexed if vector_search_available() else _nearest_scanned
    return search(project, query, k, other_than=other_than, among=among)


def _newest_vectors(
    project: Project, trace_filter: Q, most: int
) -> tuple[np.ndarray, np.ndarray, bool]:
    """(trace ids, vectors) of the `most` newest matching traces, and whether there were more."""
    pairs = list(_embedding_rows(project, trace_filter)[: most + 1])
    return (*_as_matrix(pairs[:most]), len(pairs) > most)


def _vector_of(trace: Trace) -> np.ndarray | None:
    row = TraceEmbedding.objects.filter(trace=trace, model_name=similarity.MODEL_NAME).first()
    return similarity.from_bytes([row.vector])[0] if row else None


def similarity_between(trace: Trace, other: Trace) -> float:
    """Cosine similarity of two traces' embeddings; 0.0 while either has none."""
    vector, other_vector = _vector_of(trace), _vector_of(other)
    if vector is None or other_vector is None:
        return 0.0
    return float(vector @ other_vector)


@dataclass(frozen=True)
class SimilarTrace:
    trace: Trace
    score: float  # cosine similarity, 1 is the same text


def similar_traces(*, trace: Trace, limit: int = 10) -> list[SimilarTrace] | None:
    """The project's traces most like this one, best first; None while it has no vector."""
    query = _vector_of(trace)
    if query is None:
        return None
    nearest = _nearest(trace.project, query, limit, other_than=trace.pk)
    by_id = Trace.objects.defer("body").in_bulk([trace_id for trace_id, _ in nearest])
    return [
        SimilarTrace(by_id[trace_id], score) for trace_id, score in nearest if trace_id in by_id
    ]


@dataclass(frozen=True)
class TagSuggestion:
    tag: Tag
    score: float  # similarity-weighted share of the nearest reviewed traces that carry it
    votes: int  # how many of them carry it
    neighbours: int  # how many similar reviewed traces were asked: the votes are out of these


def suggested_tags(
    *, trace: Trace, neighbours: int = 10, min_score: float = 0.3
) -> list[TagSuggestion]:
    """Tags reviewers put on the reviewed traces nearest to this one, best first."""
    query = _vector_of(trace)
    if query is None:
        return []
    reviewed = Exists(TraceTag.objects.filter(trace=OuterRef("pk"), reviewer__isnull=False))
    nearest = _nearest(trace.project, query, neighbours, other_than=trace.pk, among=Q(reviewed))
    # Only traces that point the same way count as similar; the rest have no say.
    weights = {trace_id: score for trace_id, score in nearest if score > 0}
    total = sum(weights.values())
    if not total:
        return []
    tags_of: dict[int, set[int]] = defaultdict(set)
    for trace_id, tag_id in TraceTag.objects.filter(
        trace_id__in=weights, reviewer__isnull=False
    ).values_list("trace_id", "tag_id"):
        tags_of[trace_id].add(tag_id)
    weight_of_tag: Counter = Counter()
    votes: Counter = Counter()
    for trace_id, tag_ids in tags_of.items():
        for tag_id in tag_ids:
            weight_of_tag[tag_id] += weights[trace_id]
            votes[tag_id] += 1
    tags = Tag.objects.in_bulk(list(weight_of_tag))
    suggestions = [
        TagSuggestion(tags[tag_id], weight / total, votes[tag_id], len(weights))
        for tag_id, weight in weight_of_tag.items()
        if weight / total >= min_score
    ]
    return sorted(suggestions, key=lambda suggestion: (-suggestion.score, suggestion.tag.name))


def failing() -> Q:
    """Traces that went wrong or that someone wrote feedback on."""
    return (
        ~Q(termination=Termination.COMPLETED)
        | Q(success=False)
        | Q(Exists(Feedback.objects.filter(trace=OuterRef("pk"))))
    )


@dataclass(frozen=True)
class Cluster:
    size: int
    examples: list[Trace]  # the members nearest the centre first
    terminations: list[tuple[str, int]]  # most common first
    tags: list[tuple[str, int]]  # reviewers' tags on members, most common first
    feedback: list[str]  # a few feedback texts written on members


@dataclass(frozen=True)
class FailureClusters:
    clusters: list[Cluster]  # largest first
    # More failing traces were embedded than one clustering reads (similarity.MAX_CLUSTERED):
    # the newest were grouped, the older ones left out, and the page says so.
    older_left_out: bool


def failure_clusters(
    *, project: Project, clusters: int | None = None, examples: int = 5, seed: int = 0
) -> FailureClusters:
    """The project's newest failing traces grouped by meaning (spherical k-means)."""
    ids, matrix, older_left_out = _newest_vectors(project, failing(), similarity.MAX_CLUSTERED)
    if not len(ids):
        return FailureClusters([], older_left_out=False)
    labels, centroids = similarity.kmeans(
        matrix, clusters or similarity.cluster_count(len(ids)), seed=seed
    )
    groups = []
    for index in range(len(centroids)):
        members = np.flatnonzero(labels == index)
        if len(members):
            order = members[np.argsort(-(matrix[members] @ centroids[index]), kind="stable")]
            groups.append([int(ids[member]) for member in order])
    groups.sort(key=len, reverse=True)
    return FailureClusters(
        [_describe_cluster(members, examples) for members in groups], older_left_out
    )


def _describe_cluster(members: list[int], examples: int) -> Cluster:
    shown = Trace.objects.defer("body").in_bulk(members[:examples])
    terminations = Counter(
        Trace.objects.filter(pk__in=members).values_list("termination", flat=True)
    )
    tags = Counter(
        TraceTag.objects.filter(trace_id__in=members, reviewer__isnull=False).values_list(
            "tag__name", flat=True
        )
    )
    feedback = Feedback.objects.filter(trace_id__in=members).order_by("-id")
    feedback = list(feedback.values_list("text", flat=True)[:3])
    return Cluster(
        size=len(members),
        examples=[shown[trace_id] for trace_id in members[:examples] if trace_id in shown],
        terminations=terminations.most_common(),
        tags=tags.most_common(5),
        feedback=feedback,
    )


@dataclass(frozen=True)
class AppliedFeedback:
    created: list[Feedback]
    skipped: list[tuple[Trace, str]]  # traces it did not fit, with the reason


@transaction.atomic
def apply_feedback_to_traces(
    *, feedback: Feedback, traces: list[Trace], reviewer
) -> AppliedFeedback:
    """Copy a feedback onto traces a reviewer confirmed as alike, each as its own Feedback.

    The copy is about the whole trace (turn numbers and tool call ids do not carry over, nor
    does a correction written for one turn); text, rating and checks do. Its author is the
    confirming reviewer and CopiedFeedback records where it came from. Applying twice adds
    nothing.
    """
    created, skipped = [], []
    for trace in traces:
        if trace.project_id != feedback.trace.project_id or trace.pk == feedback.trace_id:
            skipped.append((trace, "not another trace of this project"))
            continue
        try:
            copy, is_new = record_feedback(
                trace=trace,
                text=feedback.text,
                rating=feedback.rating,
                checks=feedback.checks,
                author=reviewer.get_username(),
                reviewer=reviewer,
            )
        except FeedbackError as error:
            skipped.append((trace, str(error)))
            continue
        if not is_new:
            skipped.append((trace, "it already has this feedback"))
            continue
        CopiedFeedback.objects.create(
            feedback=copy,
            source=feedback,
            similarity=similarity_between(feedback.trace, trace),
            confirmed_by=reviewer,
        )
        created.append(copy)
    return AppliedFeedback(created=created, skipped=skipped)
