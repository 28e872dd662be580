import base64
import contextlib
import copy
import json

import pytest

from reviewapp.traces.otel import OtlpError, traces_from_otlp

TRACE_ID = "5b8efff798038103d269b633813fc60c"
OTHER_TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
EPOCH_NS = 1_700_000_000_000_000_000  # 2023-11-14T22:13:20Z


# --- Arrange: OTLP JSON built from plain Python values ------------------------------------


def any_value(value):
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, list):
        return {"arrayValue": {"values": [any_value(item) for item in value]}}
    return {"kvlistValue": {"values": key_values(value)}}


def key_values(mapping):
    return [{"key": key, "value": any_value(value)} for key, value in mapping.items()]


def make_span(attributes, *, trace_id=TRACE_ID, name="chat gpt-4o", start=0, events=(), error=None):
    span = {
        "traceId": trace_id,
        "spanId": "eee19b7ec3c1b174",
        "name": name,
        "kind": 3,
        "startTimeUnixNano": str(EPOCH_NS + start * 1_000_000_000),
        "endTimeUnixNano": str(EPOCH_NS + (start + 1) * 1_000_000_000),
        "attributes": key_values(attributes),
        "events": [
            {"name": event_name, "attributes": key_values(fields)} for event_name, fields in events
        ],
    }
    if error is not None:
        span["status"] = {"code": 2, "message": error}
    return span


def make_request(*spans, resource=None):
    resource = {"service.name": "support-bot"} if resource is None else resource
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": key_values(resource)},
                "scopeSpans": [{"scope": {"name": "openai.agents"}, "spans": list(spans)}],
            }
        ]
    }


def text(role, content):
    return {"role": role, "parts": [{"type": "text", "content": content}]}


def tool_call(call_id, name, arguments):
    return {
        "role": "assistant",
        "parts": [{"type": "tool_call", "id": call_id, "name": name, "arguments": arguments}],
    }


def tool_response(call_id, response):
    return {
        "role": "tool",
        "parts": [{"type": "tool_call_response", "id": call_id, "response": response}],
    }


def chat(inputs, outputs, *, start=0, trace_id=TRACE_ID, **attributes):
    return make_span(
        {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": "gpt-4o",
            "gen_ai.input.messages": json.dumps(inputs),
            "gen_ai.output.messages": json.dumps(outputs),
            **attributes,
        },
        trace_id=trace_id,
        start=start,
    )


def execute_tool(name, call_id, *, start, error=None, **attributes):
    attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": name,
        "gen_ai.tool.call.id": call_id,
        **attributes,
    }
    return make_span(attributes, name=f"execute_tool {name}", start=start, error=error)


WEATHER_CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}


def weather_round_trip():
    """Two chat calls around one tool execution, the second seeing the whole history."""
    question = text("user", "Weather in Paris?")
    asks_tool = tool_call("call_1", "get_weather", {"city": "Paris"})
    answer = {**text("assistant", "It is sunny."), "finish_reason": "stop"}
    return make_request(
        chat([question], [asks_tool], start=0),
        execute_tool("get_weather", "call_1", start=1),
        chat([question, asks_tool, tool_response("call_1", {"sky": "sunny"})], [answer], start=2),
    )


# --- New "parts" convention ------------------------------------------------------------------


def test_input_and_output_messages_become_one_trace():
    [trace] = traces_from_otlp(weather_round_trip())

    assert trace["external_id"] == TRACE_ID
    assert trace["messages"] == [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [WEATHER_CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "sunny"}'},
        {"role": "assistant", "content": "It is sunny."},
    ]
    assert trace["termination"] == "completed"
    assert trace["model"] == "gpt-4o"


def test_string_tool_arguments_are_kept_as_they_are():
    asks_tool = tool_call("call_1", "search", '{"q":"otel"}')

    [trace] = traces_from_otlp(make_request(chat([text("user", "find it")], [asks_tool])))

    assert trace["messages"][1]["tool_calls"][0]["function"]["arguments"] == '{"q":"otel"}'


def test_string_tool_response_is_not_json_encoded_again():
    inputs = [text("user", "go"), tool_call("c1", "ls", {}), tool_response("c1", "a.txt")]

    [trace] = traces_from_otlp(make_request(chat(inputs, [text("assistant", "done")])))

    assert trace["messages"][2] == {"role": "tool", "tool_call_id": "c1", "content": "a.txt"}


def test_text_parts_are_joined_and_tool_results_precede_text_in_one_message():
    mixed = {
        "role": "user",
        "parts": [
            {"type": "tool_call_response", "id": "c1", "response": "42"},
            {"type": "text", "content": "Thanks."},
            {"type": "text", "content": "Now summarise."},
        ],
    }
    inputs = [text("user", "compute"), tool_call("c1", "calc", {}), mixed]

    [trace] = traces_from_otlp(make_request(chat(inputs, [text("assistant", "ok")])))

    assert trace["messages"][2:4] == [
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
        {"role": "user", "content": "Thanks.\nNow summarise."},
    ]


def test_system_instructions_become_the_first_message():
    instructions = json.dumps([{"type": "text", "content": "Be brief."}])
    span = chat(
        [text("user", "hi")],
        [text("assistant", "hello")],
        **{"gen_ai.system_instructions": instructions},
    )

    [trace] = traces_from_otlp(make_request(span))

    assert trace["messages"][0] == {"role": "system", "content": "Be brief."}


def test_messages_sent_as_array_values_are_read_like_json_strings():
    span = make_span(
        {
            "gen_ai.operation.name": "chat",
            "gen_ai.input.messages": [text("user", "hi")],
            "gen_ai.output.messages": [tool_call("c9", "lookup", {"id": 7})],
        }
    )

    [trace] = traces_from_otlp(make_request(span))

    assert trace["messages"][1]["tool_calls"][0]["function"] == {
        "name": "lookup",
        "arguments": '{"id": 7}',
    }


def test_openai_shaped_messages_in_the_new_attributes_are_accepted():
    inputs = [{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url"}]}]
    outputs = [{"role": "assistant", "content": None, "tool_calls": [WEATHER_CALL]}]

    [trace] = traces_from_otlp(make_request(chat(inputs, outputs)))

    assert trace["messages"] == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [WEATHER_CALL]},
    ]


# --- Older conventions -----------------------------------------------------------------------


def test_old_indexed_attributes_become_messages():
    span = make_span(
        {
            "gen_ai.system": "openai",
            "gen_ai.request.model": "gpt-4o-mini",
            "gen_ai.prompt.0.role": "system",
            "gen_ai.prompt.0.content": "You help.",
            "gen_ai.prompt.1.role": "user",
            "gen_ai.prompt.1.content": "Weather in Paris?",
            "gen_ai.prompt.2.role": "assistant",
            "gen_ai.prompt.2.tool_calls.0.id": "call_1",
            "gen_ai.prompt.2.tool_calls.0.name": "get_weather",
            "gen_ai.prompt.2.tool_calls.0.arguments": '{"city": "Paris"}',
            "gen_ai.prompt.3.role": "tool",
            "gen_ai.prompt.3.tool_call_id": "call_1",
            "gen_ai.prompt.3.content": "sunny",
            "gen_ai.completion.0.role": "assistant",
            "gen_ai.completion.0.content": "It is sunny.",
            "gen_ai.completion.0.finish_reason": "stop",
        },
        name="openai.chat",
    )

    [trace] = traces_from_otlp(make_request(span))

    assert trace["messages"] == [
        {"role": "system", "content": "You help."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [WEATHER_CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "assistant", "content": "It is sunny."},
    ]
    assert trace["model"] == "gpt-4o-mini"


def test_indexed_attributes_are_ordered_numerically_not_alphabetically():
    attributes = {"gen_ai.operation.name": "chat"}
    for index in range(11):
        attributes[f"gen_ai.prompt.{index}.role"] = "user"
        attributes[f"gen_ai.prompt.{index}.content"] = f"message {index}"

    [trace] = traces_from_otlp(make_request(make_span(attributes)))

    assert [message["content"] for message in trace["messages"]][-2:] == ["message 9", "message 10"]


def test_indexed_content_holding_json_content_parts_keeps_the_text():
    parts = json.dumps([{"type": "text", "text": "Describe this"}, {"type": "image_url"}])
    span = make_span({"gen_ai.prompt.0.role": "user", "gen_ai.prompt.0.content": parts})

    [trace] = traces_from_otlp(make_request(span))

    assert trace["messages"] == [{"role": "user", "content": "Describe this"}]


def test_span_events_become_messages():
    events = [
        ("gen_ai.system.message", {"content": "You help."}),
        ("gen_ai.user.message", {"content": "Weather in Paris?"}),
        ("gen_ai.assistant.message", {"tool_calls": json.dumps([WEATHER_CALL])}),
        ("gen_ai.tool.message", {"id": "call_1", "content": "sunny"}),
        (
            "gen_ai.choice",
            {
                "index": 0,
                "finish_reason": "stop",
                "message": json.dumps({"role": "assistant", "content": "It is sunny."}),
            },
        ),
    ]
    span = make_span({"gen_ai.operation.name": "chat"}, events=events)

    [trace] = traces_from_otlp(make_request(span))

    assert trace["messages"] == [
        {"role": "system", "content": "You help."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [WEATHER_CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "assistant", "content": "It is sunny."},
    ]


def test_event_body_is_read_when_an_exporter_sends_one():
    span = make_span({"gen_ai.operation.name": "chat"})
    span["events"] = [
        {"name": "gen_ai.user.message", "body": any_value({"content": "hi"})},
        {"name": "gen_ai.choice", "body": any_value({"message": {"content": "hello"}})},
    ]

    [trace] = traces_from_otlp(make_request(span))

    assert trace["messages"] == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
    ]


# --- Ids, grouping and ordering --------------------------------------------------------------


def test_base64_trace_id_is_returned_as_lowercase_hex():
    encoded = base64.b64encode(bytes.fromhex(TRACE_ID)).decode()
    span = chat([text("user", "hi")], [text("assistant", "hello")], trace_id=encoded)

    [trace] = traces_from_otlp(make_request(span))

    assert trace["external_id"] == TRACE_ID


def test_uppercase_hex_trace_id_is_lowercased():
    span = chat([text("user", "hi")], [text("assistant", "hello")], trace_id=TRACE_ID.upper())

    [trace] = traces_from_otlp(make_request(span))

    assert trace["external_id"] == TRACE_ID


def test_two_traces_in_one_request_stay_apart():
    request = make_request(
        chat([text("user", "first")], [text("assistant", "one")], trace_id=TRACE_ID),
        chat([text("user", "second")], [text("assistant", "two")], trace_id=OTHER_TRACE_ID),
    )

    traces = traces_from_otlp(request)

    assert [(trace["external_id"], trace["messages"][0]["content"]) for trace in traces] == [
        (TRACE_ID, "first"),
        (OTHER_TRACE_ID, "second"),
    ]


def test_spans_of_one_trace_are_grouped_across_resource_spans_and_ordered_by_start():
    question = text("user", "Weather?")
    asks_tool = tool_call("call_1", "get_weather", {"city": "Paris"})
    later = make_request(
        chat(
            [question, asks_tool, tool_response("call_1", "sunny")],
            [text("assistant", "Sunny.")],
            start=5,
        )
    )
    earlier = make_request(
        chat([question], [asks_tool], start=0), resource={"service.name": "planner"}
    )
    request = {"resourceSpans": later["resourceSpans"] + earlier["resourceSpans"]}

    [trace] = traces_from_otlp(request)

    assert [message["role"] for message in trace["messages"]] == [
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    assert trace["metadata"]["otel"]["span_count"] == 2
    assert trace["metadata"]["otel"]["service.name"] == "planner"
    assert trace["started_at"] == "2023-11-14T22:13:20+00:00"
    assert trace["ended_at"] == "2023-11-14T22:13:26+00:00"


# --- Stitching the conversation across calls -------------------------------------------------


def test_delta_inputs_are_appended_without_duplicating_messages():
    system = text("system", "You help.")
    asks_tool = tool_call("call_1", "get_weather", {"city": "Paris"})
    request = make_request(
        chat([system, text("user", "Weather?")], [asks_tool], start=0),
        # This framework resends the system prompt but only the newest message.
        chat([system, tool_response("call_1", "sunny")], [text("assistant", "Sunny.")], start=2),
    )

    [trace] = traces_from_otlp(request)

    assert [message["role"] for message in trace["messages"]] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]


def test_history_with_reserialised_tool_arguments_still_counts_as_the_same_call():
    question = text("user", "Weather?")
    request = make_request(
        chat([question], [tool_call("call_1", "get_weather", '{"city":"Paris"}')], start=0),
        chat(
            [
                question,
                tool_call("call_1", "get_weather", '{"city": "Paris"}'),
                tool_response("call_1", "sun"),
            ],
            [text("assistant", "Sunny.")],
            start=2,
        ),
    )

    [trace] = traces_from_otlp(request)

    assert len(trace["messages"]) == 4


def test_repeated_messages_in_a_growing_history_are_kept():
    first = [text("user", "ok"), text("assistant", "Sure.")]
    request = make_request(
        chat(first[:1], first[1:], start=0),
        chat([*first, text("user", "ok")], [text("assistant", "Sure again.")], start=2),
    )

    [trace] = traces_from_otlp(request)

    assert [message["content"] for message in trace["messages"]] == [
        "ok",
        "Sure.",
        "ok",
        "Sure again.",
    ]


# --- Termination -----------------------------------------------------------------------------


def test_tool_error_that_ends_the_run_gives_tool_error_and_is_kept_in_metadata():
    asks_tool = tool_call("call_1", "get_weather", {"city": "Paris"})
    request = make_request(
        chat([text("user", "Weather?")], [asks_tool], start=0),
        execute_tool("get_weather", "call_1", start=1, error="HTTP 503 from weather API"),
    )

    [trace] = traces_from_otlp(request)

    assert trace["termination"] == "tool_error"
    assert trace["metadata"]["otel"]["tool_errors"] == [
        {"tool": "get_weather", "call_id": "call_1", "message": "HTTP 503 from weather API"}
    ]


def test_tool_error_that_also_fails_the_agent_span_is_still_a_tool_error():
    request = make_request(
        make_span(
            {"gen_ai.operation.name": "invoke_agent"}, name="invoke_agent", start=0, error="boom"
        ),
        chat([text("user", "Weather?")], [tool_call("call_1", "get_weather", {})], start=1),
        execute_tool("get_weather", "call_1", start=2, error="boom"),
    )

    [trace] = traces_from_otlp(request)

    assert trace["termination"] == "tool_error"


def test_tool_error_the_agent_recovered_from_is_completed_and_not_in_metadata():
    question = text("user", "Weather?")
    asks_tool = tool_call("call_1", "get_weather", {})
    failure = tool_response("call_1", "Error: HTTP 503")
    request = make_request(
        chat([question], [asks_tool], start=0),
        execute_tool("get_weather", "call_1", start=1, error="HTTP 503"),
        chat(
            [question, asks_tool, failure],
            [text("assistant", "The weather service is down.")],
            start=2,
        ),
    )

    [trace] = traces_from_otlp(request)

    assert trace["termination"] == "completed"
    assert "tool_errors" not in trace["metadata"]["otel"]


def test_error_on_an_llm_call_gives_error():
    span = chat([text("user", "hi")], [], start=0)
    span["status"] = {"code": "STATUS_CODE_ERROR", "message": "rate limited"}

    [trace] = traces_from_otlp(make_request(span))

    assert trace["termination"] == "error"


def test_timeout_error_type_gives_timeout():
    span = chat([text("user", "hi")], [], **{"error.type": "openai.APITimeoutError"})

    [trace] = traces_from_otlp(make_request(span))

    assert trace["termination"] == "timeout"


def test_finish_reason_length_is_still_completed():
    output = {**text("assistant", "It was a dark and"), "finish_reason": "length"}

    [trace] = traces_from_otlp(make_request(chat([text("user", "story")], [output])))

    assert trace["termination"] == "completed"


def test_run_without_any_output_is_unknown():
    [trace] = traces_from_otlp(make_request(chat([text("user", "hi")], [])))

    assert trace["termination"] == "unknown"


# --- Model, usage, tools, metadata -----------------------------------------------------------


def test_usage_is_summed_over_llm_calls_in_either_naming():
    request = make_request(
        chat(
            [text("user", "a")],
            [text("assistant", "b")],
            start=0,
            **{
                "gen_ai.usage.input_tokens": 100,
                "gen_ai.usage.output_tokens": 20,
            },
        ),
        chat(
            [text("user", "a")],
            [text("assistant", "c")],
            start=2,
            **{
                "gen_ai.usage.prompt_tokens": 150,
                "gen_ai.usage.completion_tokens": 5,
            },
        ),
        make_span(
            {"gen_ai.operation.name": "invoke_agent", "gen_ai.usage.input_tokens": 999}, start=0
        ),
    )

    [trace] = traces_from_otlp(request)

    assert trace["usage"] == {"prompt_tokens": 250, "completion_tokens": 25}


def test_usage_is_none_when_no_call_reports_it():
    [trace] = traces_from_otlp(make_request(chat([text("user", "a")], [text("assistant", "b")])))

    assert trace["usage"] is None


def test_model_is_the_last_calls_response_model():
    request = make_request(
        chat(
            [text("user", "a")],
            [text("assistant", "b")],
            start=0,
            **{"gen_ai.response.model": "m-1"},
        ),
        chat(
            [text("user", "a")],
            [text("assistant", "c")],
            start=2,
            **{"gen_ai.response.model": "m-2"},
        ),
    )

    [trace] = traces_from_otlp(request)

    assert trace["model"] == "m-2"


def test_tool_definitions_are_normalised_and_deduplicated_by_name():
    weather = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather",
            "parameters": {"type": "object"},
        },
    }
    flat_search = {"type": "function", "name": "search", "parameters": {"type": "object"}}
    definitions = {"gen_ai.tool.definitions": json.dumps([weather, flat_search])}
    request = make_request(
        chat([text("user", "a")], [text("assistant", "b")], start=0, **definitions),
        chat([text("user", "a")], [text("assistant", "c")], start=2, **definitions),
    )

    [trace] = traces_from_otlp(request)

    assert trace["tools"] == [
        weather,
        {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}},
    ]


def test_metadata_keeps_resource_and_agent_identity_and_omits_what_is_missing():
    agent = make_span(
        {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": "triage",
            "gen_ai.conversation.id": "conv-7",
        },
        name="invoke_agent triage",
    )
    request = make_request(
        agent,
        chat([text("user", "a")], [text("assistant", "b")], start=1),
        resource={"service.name": "support-bot", "deployment.environment": "prod"},
    )

    [trace] = traces_from_otlp(request)

    assert trace["metadata"] == {
        "otel": {
            "service.name": "support-bot",
            "resource": {"service.name": "support-bot", "deployment.environment": "prod"},
            "span_count": 2,
            "conversation_id": "conv-7",
            "agent_name": "triage",
        }
    }


def test_every_attribute_value_type_decodes_to_plain_json():
    resource = [
        {"key": "count", "value": {"intValue": "7"}},
        {"key": "count_as_number", "value": {"intValue": 8}},
        {"key": "ratio", "value": {"doubleValue": 0.5}},
        {"key": "nan", "value": {"doubleValue": "NaN"}},
        {"key": "on", "value": {"boolValue": True}},
        {"key": "raw", "value": {"bytesValue": "AQI="}},
        {"key": "empty", "value": {}},
        {
            "key": "nested",
            "value": {
                "kvlistValue": {
                    "values": [
                        {"key": "tags", "value": {"arrayValue": {"values": [{"stringValue": "a"}]}}}
                    ]
                }
            },
        },
    ]
    request = make_request(chat([text("user", "a")], [text("assistant", "b")]))
    request["resourceSpans"][0]["resource"]["attributes"] = resource

    [trace] = traces_from_otlp(request)

    assert trace["metadata"]["otel"]["resource"] == {
        "count": 7,
        "count_as_number": 8,
        "ratio": 0.5,
        "nan": "NaN",
        "on": True,
        "raw": "AQI=",
        "empty": None,
        "nested": {"tags": ["a"]},
    }


def test_conversation_recorded_only_on_the_agent_span_is_used():
    agent = make_span(
        {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.input.messages": json.dumps([text("user", "hi")]),
            "gen_ai.output.messages": json.dumps([text("assistant", "hello")]),
        },
        name="invoke_agent",
    )

    [trace] = traces_from_otlp(make_request(agent))

    assert [message["content"] for message in trace["messages"]] == ["hi", "hello"]


def test_trace_without_messages_is_skipped():
    http_only = make_span({"http.method": "GET"}, name="GET /health")
    embedding = make_span(
        {"gen_ai.operation.name": "embeddings"}, name="embeddings", trace_id=OTHER_TRACE_ID
    )

    assert traces_from_otlp(make_request(http_only, embedding)) == []


def test_empty_request_gives_no_traces():
    assert traces_from_otlp({}) == []
    assert traces_from_otlp({"resourceSpans": []}) == []


# --- Malformed input -------------------------------------------------------------------------


def test_wrong_trace_id_is_rejected_with_its_path():
    span = chat([text("user", "hi")], [], trace_id="not-a-trace-id")

    with pytest.raises(
        OtlpError, match=r"^resourceSpans\[0\]\.scopeSpans\[0\]\.spans\[0\]\.traceId: "
    ):
        traces_from_otlp(make_request(span))


def test_spans_that_are_not_a_list_are_rejected_with_their_path():
    request = {"resourceSpans": [{"scopeSpans": [{"spans": {"traceId": TRACE_ID}}]}]}

    with pytest.raises(
        OtlpError, match=r"^resourceSpans\[0\]\.scopeSpans\[0\]\.spans: expected a list"
    ):
        traces_from_otlp(request)


def test_attribute_value_of_unknown_type_is_rejected_with_its_path():
    span = chat([text("user", "hi")], [])
    span["attributes"].append({"key": "x", "value": {"decimalValue": "1.0"}})

    with pytest.raises(OtlpError, match=r"spans\[0\]\.attributes\[4\]\.value: unknown value type"):
        traces_from_otlp(make_request(span))


def test_number_where_an_object_is_expected_is_rejected_with_its_path():
    request = {"resourceSpans": [{"resource": 5, "scopeSpans": []}]}

    with pytest.raises(OtlpError, match=r"^resourceSpans\[0\]\.resource: expected an object"):
        traces_from_otlp(request)


def test_request_body_that_is_not_an_object_is_rejected():
    with pytest.raises(OtlpError, match="request body"):
        traces_from_otlp([])  # type: ignore[arg-type]


def test_invalid_json_in_messages_is_rejected_with_the_attribute_name():
    span = make_span({"gen_ai.operation.name": "chat", "gen_ai.input.messages": "[{not json"})

    with pytest.raises(OtlpError, match=r"attributes\[gen_ai\.input\.messages\]: not valid JSON"):
        traces_from_otlp(make_request(span))


def test_wrong_part_shape_inside_a_message_names_the_part():
    span = chat([{"role": "user", "parts": [{"type": "text", "content": 5}]}], [])

    with pytest.raises(
        OtlpError, match=r"input\.messages\]\[0\]\.parts\[0\]\.content: expected a string"
    ):
        traces_from_otlp(make_request(span))


@pytest.mark.parametrize(
    "time",
    ["soon", -1, 1.5, True, "99999999999999999999"],
)
def test_bad_start_time_is_rejected(time):
    span = chat([text("user", "hi")], [])
    span["startTimeUnixNano"] = time

    with pytest.raises(OtlpError, match=r"startTimeUnixNano"):
        traces_from_otlp(make_request(span))


def fuzz_payload():
    """A valid request whose messages are structured AnyValues, so every field is reachable."""
    span = make_span(
        {
            "gen_ai.operation.name": "chat",
            "gen_ai.system_instructions": [{"type": "text", "content": "Be brief."}],
            "gen_ai.input.messages": [
                text("user", "hi"),
                tool_call("c1", "ls", {"path": "/"}),
                tool_response("c1", ["a"]),
            ],
            "gen_ai.output.messages": [text("assistant", "done")],
            "gen_ai.tool.definitions": [{"type": "function", "function": {"name": "ls"}}],
            "gen_ai.usage.input_tokens": 3,
            "gen_ai.response.model": "m",
            "gen_ai.prompt.0.content": "old",
            "gen_ai.completion.0.tool_calls.0.name": "ls",
            "score": 0.5,
            "flag": True,
        },
        events=[("gen_ai.user.message", {"content": "hi"}), ("gen_ai.choice", {"message": {}})],
    )
    span["status"] = {"code": 1, "message": ""}
    return make_request(span, execute_tool("ls", "c1", start=1, error="denied"))


def all_paths(node, path=()):
    yield path
    children = (
        node.items()
        if isinstance(node, dict)
        else enumerate(node)
        if isinstance(node, list)
        else ()
    )
    for key, child in children:
        yield from all_paths(child, (*path, key))


WRONG_VALUES = [None, 0, -3, 1.5, True, "x", "", [], {}, [1], {"x": 1}, {"stringValue": 1}]


def test_any_wrong_value_anywhere_gives_otlp_error_or_a_result():
    payload = fuzz_payload()
    assert traces_from_otlp(payload)  # the unmodified payload is valid

    for path in list(all_paths(payload))[1:]:
        for wrong in WRONG_VALUES:
            broken = copy.deepcopy(payload)
            parent = broken
            for key in path[:-1]:
                parent = parent[key]
            parent[path[-1]] = wrong
            with contextlib.suppress(OtlpError):
                traces_from_otlp(broken)
