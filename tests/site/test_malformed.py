"""A corpus of malformed requests: each gets a 4xx with a JSON error naming the problem, never
a 500. Whole-body problems get `{"error", "detail"}`; one bad trace in a batch gets its own 4xx
item status beside the good ones."""

import gzip
import json

import pytest

from tests.factories import make_trace

TRACE = make_trace("t-1")


def _trace_bytes(**overrides) -> bytes:
    return json.dumps({"traces": [{**TRACE, **overrides}]}).encode()


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


# (name, raw body): bodies no JSON parser should accept as the request they claim to be.
BAD_BODIES = [
    ("empty", b""),
    ("whitespace", b"  \n "),
    ("truncated", b'{"traces": [{"external_id": "a"'),
    ("latin-1", '{"traces": [{"external_id": "caf\u00e9", "messages": []}]}'.encode("latin-1")),
    ("utf-16", json.dumps({"traces": [TRACE]}).encode("utf-16")),
    ("utf-8 with a BOM", b"\xef\xbb\xbf" + json.dumps({"traces": [TRACE]}).encode()),
    ("invalid utf-8 in a string", b'{"traces": [{"external_id": "\xff\xfe\xc3\x28"}]}'),
    ("lone surrogate", b'{"traces": [{"external_id": "\\ud800"}]}'),
    ("NaN", b'{"traces": [{"external_id": "a", "outcome": {"reward": NaN}}]}'),
    ("Infinity", b'{"traces": [{"external_id": "a", "outcome": {"reward": -Infinity}}]}'),
    ("nesting past the parser's limit", ('{"traces": ' + _nested(5000) + "}").encode()),
    ("trailing garbage", json.dumps({"traces": []}).encode() + b" {}"),
    ("single quotes", b"{'traces': []}"),
    ("a NUL byte", b'{"traces": []}\x00'),
    ("a number past float range", b'{"traces": [{"external_id": "a", "reward": 1e400}]}'),
    ("gzip without asking", gzip.compress(json.dumps({"traces": [TRACE]}).encode())),
]

# (name, JSON body): valid JSON whose shape is wrong for the whole request.
WRONG_SHAPES = [
    ("a list", []),
    ("a string", "traces"),
    ("a number", 7),
    ("null", None),
    ("no traces", {}),
    ("traces not a list", {"traces": {"external_id": "a"}}),
    ("traces a string", {"traces": "a"}),
]

# (name, item overrides): one bad trace in an otherwise good batch.
BAD_ITEMS = [
    ("external_id missing", {"external_id": None}),
    ("external_id a number", {"external_id": 7}),
    ("external_id empty", {"external_id": ""}),
    ("external_id huge", {"external_id": "x" * 100_000}),
    ("external_id with a NUL", {"external_id": "a\u0000b"}),
    ("metadata with a NUL", {"metadata": {"k": "a\u0000b"}}),
    ("metadata key with a NUL", {"metadata": {"a\u0000": 1}}),
    ("model with a NUL", {"model": "m\u0000"}),
    ("a tag with a NUL", {"tags": ["a\u0000"]}),
    ("messages not a list", {"messages": "hello"}),
    ("messages empty", {"messages": []}),
    ("a message not an object", {"messages": ["hello"]}),
    ("an unknown role", {"messages": [{"role": "wizard", "content": "hi"}]}),
    ("content a number", {"messages": [{"role": "user", "content": 7}]}),
    ("tool_calls not a list", {"messages": [{"role": "assistant", "tool_calls": "x"}]}),
    (
        "a tool result for no call",
        {"messages": [{"role": "tool", "tool_call_id": "c9", "content": "x"}]},
    ),
    ("tools not a list", {"tools": {"type": "function"}}),
    ("metadata a list", {"metadata": [1, 2]}),
    ("metadata too deep", {"metadata": json.loads(_nested(100))}),
    ("termination unknown", {"termination": "exploded"}),
    ("reward a string", {"outcome": {"reward": "high"}}),
    ("success a string", {"outcome": {"success": "maybe"}}),
    ("started_at not a date", {"started_at": "yesterday-ish"}),
    ("started_at year 0", {"started_at": "0000-01-01T00:00:00Z"}),
    ("tags not a list", {"tags": "slow"}),
    ("a tag a number", {"tags": [7]}),
    ("usage tokens negative", {"usage": {"prompt_tokens": -1}}),
    ("usage tokens past bigint", {"usage": {"prompt_tokens": 2**70}}),
]

# (name, JSON body) for feedback on the stored trace.
BAD_FEEDBACK = [
    ("text missing", {}),
    ("text a number", {"text": 7}),
    ("turn past bigint", {"text": "x", "turn": 2**70}),
    ("turn negative", {"text": "x", "turn": -1}),
    ("turn not an assistant message", {"text": "x", "turn": 1}),
    ("turn past the end", {"text": "x", "turn": 10**6}),
    ("rating a string", {"text": "x", "rating": "good"}),
    ("correction not a message", {"text": "x", "turn": 4, "correction": "better"}),
    (
        "check of an unknown kind",
        {"text": "x", "turn": 4, "checks": [{"kind": "vibes", "value": 1}]},
    ),
    (
        "regex that does not compile",
        {"text": "x", "turn": 4, "checks": [{"kind": "regex", "value": "("}]},
    ),
    ("tool_call_id unknown", {"text": "x", "tool_call_id": "nope"}),
    ("text with a NUL", {"text": "a\u0000b"}),
    ("author with a NUL", {"text": "x", "author": "a\u0000b"}),
    (
        "a check value with a NUL",
        {"text": "x", "turn": 4, "checks": [{"kind": "regex", "value": "\u0000"}]},
    ),
]


def _assert_json_error(response, *, status_range=range(400, 500)):
    assert response.status_code in status_range, (response.status_code, response.content[:300])
    body = json.loads(response.content)
    assert set(body) >= {"error", "detail"} and body["detail"], body


@pytest.mark.parametrize("name,body", BAD_BODIES, ids=[n for n, _ in BAD_BODIES])
def test_a_body_that_is_not_json_gets_400(api, name, body):
    _assert_json_error(api.post("/api/v1/traces", body=body))


def test_gzip_content_encoding_is_not_decompressed_so_a_bomb_is_just_a_bad_body(api):
    bomb = gzip.compress(b"[" * 50_000_000)  # 50 MB of brackets in ~50 KB
    response = api.post("/api/v1/traces", body=bomb, HTTP_CONTENT_ENCODING="gzip")
    _assert_json_error(response)


@pytest.mark.parametrize("name,payload", WRONG_SHAPES, ids=[n for n, _ in WRONG_SHAPES])
def test_a_request_of_the_wrong_shape_gets_a_json_4xx(api, name, payload):
    _assert_json_error(api.post("/api/v1/traces", payload))


@pytest.mark.parametrize("name,overrides", BAD_ITEMS, ids=[n for n, _ in BAD_ITEMS])
def test_one_bad_trace_gets_its_own_4xx_and_the_good_one_lands(api, project, name, overrides):
    bad = {**make_trace("bad"), **overrides}
    response = api.post("/api/v1/traces", {"traces": [make_trace("good"), bad]})
    assert response.status_code == 207, response.content[:300]
    good_result, bad_result = response.json()["results"]
    assert good_result["status"] == 201
    assert 400 <= bad_result["status"] < 500 and bad_result["error"], bad_result
    assert list(project.traces.values_list("external_id", flat=True)) == ["good"]


def test_a_body_over_the_size_limit_gets_413(api, settings):
    settings.INGEST_MAX_BODY_BYTES = settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10_000
    big = make_trace("t", metadata={"x": "y" * 20_000})
    response = api.post("/api/v1/traces", {"traces": [big]})
    assert response.status_code == 413
    _assert_json_error(response, status_range=[413])


def test_a_batch_over_the_count_limit_gets_413(api, settings):
    settings.INGEST_MAX_TRACES_PER_BATCH = 3
    response = api.post("/api/v1/traces", {"traces": [make_trace(f"t{i}") for i in range(4)]})
    _assert_json_error(response, status_range=[413])


def test_a_content_length_that_is_not_a_number_gets_400(api):
    response = api.post("/api/v1/traces", {"traces": []}, CONTENT_LENGTH="lots")
    _assert_json_error(response)


@pytest.mark.parametrize("name,payload", BAD_FEEDBACK, ids=[n for n, _ in BAD_FEEDBACK])
def test_bad_feedback_gets_a_json_4xx(api, name, payload):
    api.post("/api/v1/traces", {"traces": [TRACE]})
    _assert_json_error(api.post("/api/v1/traces/t-1/feedback", payload))


@pytest.mark.parametrize(
    "path",
    ["/api/v1/runs/99999999999999999999999", "/api/v1/runs/-1", "/api/v1/traces/%00"],
)
def test_path_parameters_out_of_range_get_a_json_4xx(api, path):
    _assert_json_error(api.get(path))


@pytest.mark.parametrize(
    "query",
    [{"limit": "-5"}, {"limit": "10000000000000000000000"}, {"cursor": "not-a-cursor"},
     {"source": "\x00"}, {"q": "x" * 10_000}],
)  # fmt: skip
def test_bad_list_queries_get_a_json_4xx_or_an_answer(api, query):
    response = api.get("/api/v1/traces", **query)
    if response.status_code != 200:
        _assert_json_error(response)


@pytest.mark.parametrize("name,body", BAD_BODIES[:12], ids=[n for n, _ in BAD_BODIES[:12]])
def test_otel_ingest_refuses_the_same_bodies_with_400(api, name, body):
    _assert_json_error(api.post("/api/v1/otel/v1/traces", body=body))


@pytest.mark.parametrize(
    "body",
    [b"", b"not json", b"[]", b'{"model": 7}', b'{"model": "m", "x": NaN}',
     ("[" * 5000).encode(), b'{"model": "\xff"}'],
)  # fmt: skip
def test_the_gateway_answers_malformed_calls_400_in_openai_shape(api, body):
    response = api.post("/v1/chat/completions", body=body)
    assert response.status_code == 400
    assert json.loads(response.content)["error"]["message"]
