"""Trace embeddings in the database, and what they are for: similar traces, failure clusters,
suggested tags, and how alike two traces are when a feedback is copied from one to the other.

Vectors are read per project, newest first, up to similarity.MAX_COMPARED; beyond that the
oldest traces are not compared (a vector index would lift the cap).
"""

from collections import Counter, defaultdict
from dataclasses import dataclass

import numpy as np
from django.db import transaction
from django.db.models import Exists, OuterRef, Q

from reviewapp import similarity
from reviewapp.models import (
    Feedback,
    Project,
    Tag,
    Termination,
    Trace,
    TraceEmbedding,
    TraceTag,
)

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
                "id", "project_id", "body", "termination"
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
    TraceEmbedding.objects.bulk_create(
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


def _vectors(project: Project, trace_filter: Q | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(trace ids, vectors) of the project's newest embedded traces, optionally filtered."""
    rows = TraceEmbedding.objects.filter(project=project, model_name=similarity.MODEL_NAME)
    if trace_filter is not None:
        rows = rows.filter(trace__in=Trace.objects.filter(trace_filter))
    rows = rows.order_by("-trace_id").values_list("trace_id", "vector")
    pairs = list(rows[: similarity.MAX_COMPARED])
    ids = np.array([trace_id for trace_id, _ in pairs], dtype=np.int64)
    return ids, similarity.from_bytes([vector for _, vector in pairs])


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
    ids, matrix = _vectors(trace.project, ~Q(pk=trace.pk))
    top, scores = similarity.nearest(matrix, query, limit)
    by_id = Trace.objects.defer("body").in_bulk([int(ids[index]) for index in top])
    return [
        SimilarTrace(by_id[int(ids[index])], float(score))
        for index, score in zip(top, scores, strict=True)
        if int(ids[index]) in by_id
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
    ids, matrix = _vectors(trace.project, Q(reviewed) & ~Q(pk=trace.pk))
    top, scores = similarity.nearest(matrix, query, neighbours)
    # Only traces that point the same way count as similar; the rest have no say.
    weights = {
        int(ids[index]): float(score) for index, score in zip(top, scores, strict=True) if score > 0
    }
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


def failure_clusters(
    *, project: Project, clusters: int | None = None, examples: int = 5, seed: int = 0
) -> list[Cluster]:
    """The project's failing traces grouped by meaning (spherical k-means), largest first."""
    ids, matrix = _vectors(project, failing())
    if not len(ids):
        return []
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
    return [_describe_cluster(members, examples) for members in groups]


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
