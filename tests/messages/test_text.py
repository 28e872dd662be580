from messages.text import content_text, media_part_types, message_text

IMAGE = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}


def test_string_content_is_the_text():
    assert content_text("It is sunny.") == "It is sunny."


def test_missing_content_is_empty_text():
    assert message_text({"role": "assistant", "content": None, "tool_calls": []}) == ""


def test_text_parts_and_plain_string_parts_are_joined_with_newlines():
    content = [{"type": "text", "text": "first"}, "second", {"type": "input_text", "text": "third"}]

    assert content_text(content) == "first\nsecond\nthird"


def test_media_parts_add_no_text():
    assert content_text([{"type": "text", "text": "Describe this"}, IMAGE]) == "Describe this"


def test_refusal_and_thinking_parts_are_text_as_the_model_server_reads_them():
    content = [{"type": "thinking", "thinking": "hmm"}, {"type": "refusal", "refusal": "No."}]

    assert content_text(content) == "hmm\nNo."


def test_empty_and_malformed_parts_are_skipped():
    content = [{"type": "text", "text": ""}, {"type": "text"}, 7, {"type": ["text"]}, "kept"]

    assert content_text(content) == "kept"


def test_content_that_is_not_openai_content_reads_as_its_json():
    assert content_text({"weird": "shape"}) == '{"weird": "shape"}'


def test_media_part_types_name_the_parts_without_text():
    content = [{"type": "text", "text": "look"}, IMAGE, {"no_type": 1}]

    assert media_part_types(content) == ["image_url", "part"]
