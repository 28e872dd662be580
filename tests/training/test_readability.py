"""How much a reply reads as an answer, on plain text."""

from training.readability import WELL_FORMED_MIN, looks_garbled, well_formedness


def test_a_plain_answer_is_well_formed():
    assert well_formedness("We accept Visa, Mastercard and PayPal.") == 1.0
    assert well_formedness("29 * 6 = 174.") == 1.0


def test_chat_template_markup_in_an_answer_looks_garbled():
    leaked = "<tool_response>\nWe accept Visa, Mastercard and PayPal.\n</tool_response>"
    assert well_formedness(leaked) < WELL_FORMED_MIN


def test_the_feedback_repeated_back_looks_garbled():
    feedback = "The lookup failed: say so and offer to try again, do not guess."
    assert well_formedness(feedback, feedback_text=feedback) < WELL_FORMED_MIN
    assert well_formedness("The lookup failed; I can try again.", feedback_text=feedback) == 1.0


def test_phrases_going_round_look_garbled():
    assert well_formedness("the refund the refund the refund the refund the refund") < (
        WELL_FORMED_MIN
    )


def test_strings_of_consonants_look_garbled():
    assert well_formedness("xkcdq bcdfghj zzzzt qrstv") < WELL_FORMED_MIN


def test_a_count_in_place_of_an_answer_looks_garbled():
    count = "Answer: " + " ".join(f"{n}." for n in [1, *range(1, 42)]) + " Hope this helps."
    assert well_formedness(count) < WELL_FORMED_MIN
    assert looks_garbled(count)
    # Numbers among words are an answer: years, a short sum.
    assert well_formedness("The wars ended in 1918 and in 1945, after 4 and 6 years.") == 1.0


def test_text_with_no_words_scores_zero():
    assert well_formedness("") == 0.0
    assert well_formedness("?! ...") == 0.0
