"""Per-trace facts: tool results and errors per tool, answers, cut replies, and their sums."""

from reviewapp.traces.facts import TraceFacts, add_message_facts, facts_of
from reviewapp.traces.ingest import ingest_traces
from tests.factories import make_trace


def _call(call_id: str, name: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}


EPISODE = [
    {"role": "system", "content": "You help with orders."},
    {"role": "user", "content": "Where is order 7?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [_call("a", "lookup"), _call("b", "ship")],
    },
    {"role": "tool", "tool_call_id": "a", "content": "Error: timeout after 30s"},
    {"role": "tool", "tool_call_id": "b", "content": '{"status": "shipped"}'},
    {"role": "assistant", "content": "", "tool_calls": [_call("c", "lookup")]},
    {"role": "tool", "tool_call_id": "c", "content": "Traceback (most recent call last): boom"},
    {"role": "assistant", "content": "It shipped on Monday."},
    {"role": "user", "content": "Thanks"},
    {"role": "assistant", "content": [{"type": "text", "text": "You are welcome"}]},
]


def test_tool_results_and_errors_are_counted_per_tool():
    facts = facts_of(EPISODE)
    assert facts.tool_results == {"lookup": 2, "ship": 1}
    assert facts.tool_errors == {"lookup": 2}
    assert (facts.tool_result_count, facts.tool_error_count) == (3, 2)


def test_answers_are_text_turns_without_tool_calls_and_their_words_add_up():
    facts = facts_of(EPISODE)
    assert (facts.answer_count, facts.answer_words) == (2, 4 + 3)


def test_an_answer_written_straight_after_a_failed_tool_result_is_counted():
    # "It shipped on Monday." follows the failed retry; "You are welcome" follows the user.
    assert facts_of(EPISODE).answers_after_tool_error == 1
    retried = [
        *EPISODE[:7],
        {"role": "assistant", "content": "", "tool_calls": [_call("d", "lookup")]},
        {"role": "tool", "tool_call_id": "d", "content": "Order 7: shipped Monday"},
        {"role": "assistant", "content": "It shipped on Monday."},
    ]
    assert facts_of(retried).answers_after_tool_error == 0
    # A call after the failure is no answer; the answer after that call's success is not either.
    assert facts_of(retried).answer_count == 1


def test_a_truncated_trace_counts_one_cut_reply_unless_its_messages_say_more():
    assert facts_of(EPISODE).truncated_replies == 0
    assert facts_of(EPISODE, truncated=True).truncated_replies == 1
    cut = [
        {"role": "user", "content": "Write a lot"},
        {"role": "assistant", "content": "Part one", "finish_reason": "length"},
        {"role": "user", "content": "Go on"},
        {"role": "assistant", "content": "Part two", "finish_reason": "length"},
    ]
    assert facts_of(cut, truncated=True).truncated_replies == 2


def test_a_tool_result_answering_no_known_call_counts_under_unknown():
    messages = [{"role": "tool", "tool_call_id": "zz", "content": "Error: no such call"}]
    assert facts_of(messages).tool_errors == {"unknown": 1}


def test_facts_of_new_messages_add_to_the_earlier_facts():
    whole = facts_of(EPISODE)
    for split in range(len(EPISODE) + 1):
        earlier, new = EPISODE[:split], EPISODE[split:]
        added = add_message_facts(facts_of(earlier), new, earlier_messages=earlier[-2:])
        assert added == whole, split


def test_a_recorder_counts_a_reply_it_saw_cut():
    before = facts_of(EPISODE[:2])
    reply = {"role": "assistant", "content": "The order is"}
    after = add_message_facts(before, [reply], truncated_replies=1)
    assert after.truncated_replies == 1
    assert after.answer_count == 1


def test_columns_round_trip_through_a_row():
    class Row:
        pass

    row = Row()
    for name, value in facts_of(EPISODE).columns().items():
        setattr(row, name, value)
    assert TraceFacts.of_trace(row) == facts_of(EPISODE)


def test_ingest_stores_the_facts_of_each_trace(project):
    failing = make_trace("b", termination="truncated")
    failing["messages"][3]["content"] = "Error: division by zero"
    results = ingest_traces(project=project, raw_items=[make_trace("a"), failing])
    assert [result.status for result in results] == [201, 201]
    a, b = project.traces.order_by("external_id")
    assert (a.tool_results, a.tool_errors, a.tool_error_count) == ({"calculator": 1}, {}, 0)
    assert (b.tool_errors, b.tool_error_count, b.truncated_replies) == ({"calculator": 1}, 1, 1)
    assert (a.answer_count, a.answer_words, a.truncated_replies) == (1, 5, 0)  # "12 * 7 is 84."
    assert (a.answers_after_tool_error, b.answers_after_tool_error) == (0, 1)
