from reviewapp.traces.chat import preview_text
from reviewapp.traces.rendering import conversation
from training.targets import run_checks

IMAGE = {"type": "image_url", "image_url": {"url": "https://example.com/map.png"}}
ANSWER = {
    "role": "assistant",
    "content": [
        {"type": "text", "text": "Paris"},
        IMAGE,
        {"type": "output_text", "text": "it is."},
    ],
}


def test_the_reviewer_reads_the_text_the_training_checks_test():
    [turn] = conversation([ANSWER])

    results = run_checks(ANSWER, [{"kind": "regex", "value": r"^Paris\nit is\.$"}])

    assert turn.text == "Paris\nit is."
    assert [result.passed for result in results] == [True]


def test_parts_without_text_are_shown_as_labels_beside_the_text():
    [turn] = conversation([ANSWER])

    assert turn.media == ["image_url"]


def test_the_list_preview_is_the_first_user_message_text():
    messages = [
        {"role": "system", "content": "You help."},
        {"role": "user", "content": [{"type": "text", "text": "Where is"}, IMAGE, "this?"]},
    ]

    assert preview_text(messages) == "Where is\nthis?"
