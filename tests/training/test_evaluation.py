import pytest
import torch

from training.config import TrainingConfig
from training.evaluation import compare_replies, divergence, status, summarize
from training.trainer import Example, add_lora, train

QUESTIONS = ["what is the capital of france ?", "what color is the sky ?", "say hello"]


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        (False, True, "fixed"),
        (False, False, "still failing"),
        (True, False, "regressed"),
        (True, True, "still passing"),
    ],
)
def test_status(before, after, expected):
    assert status(before, after) == expected


def test_divergence_is_zero_for_identical_distributions():
    logits = torch.randn(2, 3, 10)

    assert divergence(logits, logits.clone(), torch.ones(2, 3), k=4) == pytest.approx([0.0, 0.0])


def test_divergence_averages_each_item_over_its_reply_tokens_only():
    teacher = torch.zeros(1, 3, 4)
    student = torch.zeros(1, 3, 4)
    student[0, 2, 0] = 50.0  # far off, but at a position outside the reply
    mask = torch.tensor([[1, 1, 0]])

    assert divergence(student, teacher, mask, k=2) == pytest.approx([0.0])


@pytest.fixture
def yes_sayer(make_tiny_llama, make_tiny_tokenizer):
    """A tiny model whose adapter was trained to answer everything with "yes"."""
    tokenizer = make_tiny_tokenizer()
    config = TrainingConfig(
        lora_r=4, lora_alpha=8, learning_rate=3e-2, epochs=15, min_steps=1, save_every_steps=0
    )
    model = add_lora(make_tiny_llama(), config)
    examples = [Example(_user(q), {"role": "assistant", "content": "yes"}) for q in QUESTIONS]
    train(model, tokenizer, config, examples=examples)
    return model, tokenizer


def test_an_item_the_adapter_now_passes_is_fixed(yes_sayer):
    model, tokenizer = yes_sayer
    items = [
        {"context": _user(q), "checks": [{"kind": "regex", "value": "^yes$"}]} for q in QUESTIONS
    ]

    results = compare_replies(model, tokenizer, items, max_new_tokens=4)

    assert [result["after"]["reply"] for result in results] == ["yes"] * 3
    assert summarize(results) == {
        "fixed": 3,
        "still failing": 0,
        "regressed": 0,
        "still passing": 0,
    }
    assert results[0]["before"]["checks"] == [{"kind": "regex", "value": "^yes$", "passed": False}]


def test_an_item_the_adapter_now_fails_has_regressed(yes_sayer):
    model, tokenizer = yes_sayer
    items = [{"context": _user(QUESTIONS[0]), "checks": [{"kind": "not_regex", "value": "^yes$"}]}]

    [result] = compare_replies(model, tokenizer, items, max_new_tokens=4)

    assert result["status"] == "regressed"


def test_teacher_divergence_and_drift_are_reported_when_asked_for(yes_sayer):
    model, tokenizer = yes_sayer
    items = [
        {"context": _user(QUESTIONS[0]), "teacher_context": _user(QUESTIONS[0] + " say yes")},
        {"context": _user(QUESTIONS[1]), "reference": {"role": "assistant", "content": "blue"}},
        {"context": _user(QUESTIONS[2])},
    ]

    results = compare_replies(model, tokenizer, items, max_new_tokens=4)

    assert results[0]["divergence_before"] >= 0 and results[0]["divergence_after"] >= 0
    assert results[1]["drift"] > 0  # the adapter moved away from the base on "blue"
    assert not {"divergence_before", "drift"} & results[2].keys()
    assert "drift" not in results[0]


def test_the_base_side_is_answered_once_for_every_candidate(yes_sayer, monkeypatch):
    import training.evaluation as evaluation
    import training.repliers as repliers

    model, tokenizer = yes_sayer
    items = [
        {
            "context": _user(q),
            "teacher_context": _user(q + " answer yes"),
            "checks": [{"kind": "regex", "value": "^yes$"}],
        }
        for q in QUESTIONS
    ]
    generated, measured = [], []
    real_generate, real_logits = repliers.generate_replies, evaluation.reply_logits
    monkeypatch.setattr(
        repliers,
        "generate_replies",
        lambda *args, **kwargs: generated.append(1) or real_generate(*args, **kwargs),
    )
    monkeypatch.setattr(
        evaluation,
        "reply_logits",
        lambda *args, **kwargs: measured.append(1) or real_logits(*args, **kwargs),
    )
    cache: dict = {}

    first = compare_replies(model, tokenizer, items, max_new_tokens=4, base_cache=cache)
    counts_first = (len(generated), len(measured))
    second = compare_replies(model, tokenizer, items, max_new_tokens=4, base_cache=cache)

    # The first evaluation answered both sides; the second only the adapter's.
    assert counts_first == (2, 4)
    assert (len(generated), len(measured)) == (3, 6)
    assert [r["before"] for r in second] == [r["before"] for r in first]
    assert [r["divergence_before"] for r in second] == [r["divergence_before"] for r in first]


def test_an_item_the_serving_adapter_passes_and_the_candidate_fails_has_regressed(
    yes_sayer, make_tiny_llama, tmp_path
):
    """The yes-sayer serves; a fresh candidate (a new adapter starts as the base) answers as
    the base did, so an item only the yes-sayer passed is lost: regressed, not still failing."""
    from training.evaluation import SERVING_ADAPTER, evaluate_adapter

    serving, tokenizer = yes_sayer
    serving.save_pretrained(tmp_path / "serving")
    config = TrainingConfig(lora_r=4, lora_alpha=8)
    candidate = add_lora(make_tiny_llama(), config)  # the yes-sayer's base: same seed
    candidate.load_adapter(str(tmp_path / "serving"), adapter_name=SERVING_ADAPTER)
    items = [
        {
            "context": _user(q),
            "teacher_context": _user(q + " say yes"),
            "checks": [{"kind": "regex", "value": "^yes$"}],
            "lesson": "Answer  yes.",
            "held_out": index == 2,
            "learned_by_serving": True,
        }
        for index, q in enumerate(QUESTIONS)
    ]

    results = compare_replies(candidate, tokenizer, items, max_new_tokens=4, serving="serving")
    report = evaluate_adapter(candidate, tokenizer, items, [], serving="serving")

    assert [result["before"]["reply"] for result in results] == ["yes"] * 3
    assert {result["status"] for result in results} == {"regressed"}
    assert candidate.active_adapter == "default"  # the candidate answers again after
    [lesson] = report["per_lesson"]
    assert lesson["lesson"] == "Answer yes."
    assert lesson["learned_by_serving"]
    assert (lesson["trained"]["regressed"], lesson["held_out"]["regressed"]) == (2, 1)
    assert lesson["held_out_adherence"] == {"before": 1.0, "after": 0.0}
    assert results[0]["divergence_before"] != results[0]["divergence_after"]


def test_a_fact_an_earlier_version_lost_is_counted_lost_from_the_base(yes_sayer, tmp_path):
    """The yes-sayer serves and the candidate answers yes as well: a fact whose right answer
    is anything but "yes" is "still failing" against what serves, and lost against the base,
    which answers it right. Feedback items are not facts; nor are other regression prompts."""
    from training.evaluation import SERVING_ADAPTER, evaluate_adapter

    model, tokenizer = yes_sayer
    model.save_pretrained(tmp_path / "serving")
    model.load_adapter(str(tmp_path / "serving"), adapter_name=SERVING_ADAPTER)
    not_yes = [{"kind": "not_regex", "value": "^yes$"}]
    facts = [
        {"source": "general", "prompt": q, "context": _user(q), "checks": not_yes}
        for q in QUESTIONS[:2]
    ]
    trace = {"source": "trace", "prompt": "say hello", "context": _user("say hello")}
    feedback = [{"context": _user(QUESTIONS[2]), "checks": not_yes, "lesson": "Not yes."}]

    report = evaluate_adapter(
        model, tokenizer, feedback, [*facts, {**trace, "checks": not_yes}], serving="serving"
    )

    regression = report["regression"]
    assert regression["summary"]["still failing"] == 3
    assert regression["facts"] == {
        "asked": 2,
        "right_by_base": 2,
        "lost_from_base": QUESTIONS[:2],
    }
    assert [row.get("right_by_base") for row in regression["items"]] == [True, True, None]
    # With the base serving, the before side is the base's: no second generation needed.
    base_report = evaluate_adapter(model, tokenizer, [], facts)
    assert base_report["regression"]["facts"]["lost_from_base"] == QUESTIONS[:2]
    assert [row["status"] for row in base_report["regression"]["items"]] == ["regressed"] * 2


def test_items_are_counted_per_lesson_grouped_by_text_without_case_or_spacing(yes_sayer):
    from training.evaluation import evaluate_adapter

    model, tokenizer = yes_sayer
    items = [
        {"context": _user(q), "checks": [{"kind": "regex", "value": "^yes$"}], "lesson": text}
        for q, text in zip(QUESTIONS, ["Say yes.", "say   YES.", "Say no."], strict=True)
    ]

    report = evaluate_adapter(model, tokenizer, items, [])

    assert [(row["lesson"], row["trained"]["fixed"]) for row in report["per_lesson"]] == [
        ("Say yes.", 2),
        ("Say no.", 1),
    ]
    assert report["per_lesson"][0]["trained_adherence"] == {"before": 0.0, "after": 1.0}
    assert report["per_lesson"][0]["held_out_adherence"] is None


def test_on_a_model_server_the_serving_side_is_the_serving_adapter_not_the_candidate(
    yes_sayer, make_tiny_llama, tmp_path
):
    """The replier saves the active adapter for the server to load: under the serving one,
    the serving adapter's weights, not the candidate's (saved beside it as "default")."""
    import httpx
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import load_file

    from tests.fake_upstream import FakeUpstream
    from training.evaluation import SERVING_ADAPTER
    from training.repliers import InProcessReplier, ServerReplier

    class SnapshotUpstream(FakeUpstream):
        """Keeps the weights of every adapter it is asked to load (the replier deletes them)."""

        def __init__(self) -> None:
            super().__init__()
            self.loaded: list[dict] = []

        async def app(self, scope, receive, send):
            body = b""
            while True:
                message = await receive()
                body += message.get("body", b"")
                if not message.get("more_body"):
                    break
            if scope["type"] == "http" and scope["path"].endswith("/load_lora_adapter"):
                path = httpx.Response(200, content=body).json()["lora_path"]
                self.loaded.append(load_file(f"{path}/adapter_model.safetensors"))

            async def replay():
                return {"type": "http.request", "body": body, "more_body": False}

            await super().app(scope, replay, send)

    serving, tokenizer = yes_sayer
    serving.save_pretrained(tmp_path / "serving")
    candidate = add_lora(make_tiny_llama(), TrainingConfig(lora_r=4, lora_alpha=8))
    candidate.load_adapter(str(tmp_path / "serving"), adapter_name=SERVING_ADAPTER)
    server = SnapshotUpstream().start()
    try:
        with httpx.Client(timeout=30) as client:
            replier = ServerReplier(
                client,
                server.url,
                base_model="fake",
                scratch_dir=tmp_path / "scratch",
                eos_token_id=tokenizer.eos_token_id,
                fallback=InProcessReplier(tokenizer.eos_token_id),
            )
            compare_replies(
                candidate,
                tokenizer,
                [{"context": _user(QUESTIONS[0])}],
                max_new_tokens=4,
                replier=replier,
                serving=SERVING_ADAPTER,
            )
    finally:
        server.stop()

    assert replier.record["error"] == ""
    before, after = server.loaded
    expected = {
        SERVING_ADAPTER: get_peft_model_state_dict(candidate, adapter_name=SERVING_ADAPTER),
        "default": get_peft_model_state_dict(candidate, adapter_name="default"),
    }
    for loaded, name in ((before, SERVING_ADAPTER), (after, "default")):
        assert loaded.keys() == expected[name].keys()
        assert all(torch.equal(loaded[key], expected[name][key]) for key in loaded)
    assert not all(torch.equal(before[key], after[key]) for key in before)


def test_a_reply_going_round_is_marked_garbled_and_one_that_reads_is_not(make_tiny_tokenizer):
    from training.evaluation import checked_reply

    tokenizer = make_tiny_tokenizer()
    item = {"context": _user(QUESTIONS[0]), "checks": [{"kind": "regex", "value": "paris"}]}

    def checked(text: str) -> dict:
        return checked_reply(tokenizer, item, tokenizer.encode(text, add_special_tokens=False))

    going_round = checked("paris , the capital , the capital , the capital , the capital")
    assert going_round["passed"] and going_round["garbled"]  # its check alone lets it through
    assert not checked("the capital of france is paris .")["garbled"]


def test_the_report_lists_replies_garbled_after_that_read_before(yes_sayer):
    from training.evaluation import evaluate_adapter, newly_garbled

    readable, going_round = "the capital is paris .", "yes no yes no yes no yes no"
    rows = [
        {"prompt": "p1", "before": {"reply": readable, "garbled": False},
         "after": {"reply": going_round, "garbled": True}},
        {"prompt": "p2", "before": {"reply": going_round, "garbled": True},
         "after": {"reply": going_round, "garbled": True}},
        {"feedback_id": 7, "before": {"reply": readable, "garbled": False},
         "after": {"reply": readable, "garbled": False}},
    ]  # fmt: skip

    assert newly_garbled(rows) == [{"prompt": "p1", "before": readable, "after": going_round}]
    model, tokenizer = yes_sayer
    report = evaluate_adapter(model, tokenizer, [{"context": _user(QUESTIONS[0])}], [])
    assert report["newly_garbled"] == newly_garbled(report["items"])
