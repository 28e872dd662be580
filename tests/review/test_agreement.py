"""Agreement statistics, checked against values worked out by hand."""

import pytest

from reviewapp.review.agreement import cohens_kappa, krippendorff_alpha_nominal, tag_agreement


def labels(*runs: tuple[str, int]) -> list[str]:
    return [label for label, count in runs for _ in range(count)]


def test_cohens_kappa_matches_the_textbook_example():
    # Wikipedia's grant-proposal example: 20 yes/yes, 5 yes/no, 10 no/yes, 15 no/no.
    # p_o = 35/50 = 0.7; A says yes 25/50, B 30/50; p_e = 0.5*0.6 + 0.5*0.4 = 0.5.
    # kappa = (0.7 - 0.5) / (1 - 0.5) = 0.4
    rater_a = labels(("yes", 20), ("yes", 5), ("no", 10), ("no", 15))
    rater_b = labels(("yes", 20), ("no", 5), ("yes", 10), ("no", 15))
    assert cohens_kappa(rater_a, rater_b) == pytest.approx(0.4)


def test_cohens_kappa_works_on_more_than_two_categories():
    # Agreement on 3 of 4; marginals a: x2 y1 z1, b: x1 y2 z1.
    # p_o = 12/16, p_e = (2*1 + 1*2 + 1*1) / 16 = 5/16, kappa = (12 - 5) / (16 - 5) = 7/11
    assert cohens_kappa(["x", "x", "y", "z"], ["x", "y", "y", "z"]) == pytest.approx(7 / 11)


def test_cohens_kappa_is_zero_at_chance_and_negative_below_it():
    assert cohens_kappa([1, 1, 0, 0], [1, 0, 1, 0]) == pytest.approx(0.0)
    assert cohens_kappa([1, 0], [0, 1]) == pytest.approx(-1.0)


def test_cohens_kappa_counts_one_shared_category_as_perfect_agreement():
    # p_e = 1 makes kappa 0/0; nobody disagreed, so we call it 1.
    assert cohens_kappa([False] * 5, [False] * 5) == 1.0


def test_cohens_kappa_is_undefined_without_pairs_and_refuses_unpaired_labels():
    assert cohens_kappa([], []) is None
    with pytest.raises(ValueError):
        cohens_kappa([1, 0], [1])


# Krippendorff (2011), "Computing Krippendorff's Alpha-Reliability", section C: 4 observers,
# 12 units, nominal data with gaps. The published nominal alpha is 0.743.
N = None
KRIPPENDORFF_2011 = list(
    zip(
        [1, 2, 3, 3, 2, 1, 4, 1, 2, N, N, N],
        [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, N, 3],
        [N, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, N],
        [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, N],
        strict=True,
    )
)


def test_krippendorff_alpha_matches_the_published_example_with_missing_values():
    # Unit 12 has one value and drops out: n = 40 pairable values.
    # Value counts n_c: 1->9, 2->13, 3->10, 4->5, 5->3, so sum n_c^2 = 384.
    # Disagreeing pairs: unit 2 (2,2,3,2) 6 ordered pairs / 3 = 2; unit 6 (1,2,3,4) 12/3 = 4;
    # unit 8 (1,1,2,1) 6/3 = 2; total 8.
    # alpha = 1 - (n-1) * 8 / (n^2 - 384) = 1 - 39 * 8 / 1216 = 0.743421...
    alpha = krippendorff_alpha_nominal(KRIPPENDORFF_2011)
    assert alpha == pytest.approx(1 - 39 * 8 / 1216)
    assert round(alpha, 3) == 0.743


def test_krippendorff_alpha_for_two_coders_is_scotts_pi_with_a_small_sample_factor():
    # The kappa example again: pooled yes = 55/100, so p_e = 0.55^2 + 0.45^2 = 0.505;
    # Scott's pi = (0.7 - 0.505) / (1 - 0.505); alpha adds the small-sample factor (n-1)/n:
    # 15 units disagree, 2 ordered pairs each: alpha = 1 - 99 * 30 / (2 * 55 * 45) = 0.4
    rater_a = labels(("yes", 25), ("no", 25))
    rater_b = labels(("yes", 20), ("no", 5), ("yes", 10), ("no", 15))
    alpha = krippendorff_alpha_nominal(list(zip(rater_a, rater_b, strict=True)))
    assert alpha == pytest.approx(1 - 99 * 30 / (2 * 55 * 45))


def test_krippendorff_alpha_leaves_out_units_with_one_value():
    with_singletons = [*KRIPPENDORFF_2011, (7, N, N, N), (N, N, 9, N)]
    assert krippendorff_alpha_nominal(with_singletons) == krippendorff_alpha_nominal(
        KRIPPENDORFF_2011
    )


def test_krippendorff_alpha_degenerate_cases():
    assert krippendorff_alpha_nominal([["a", "a", N], ["a", "a", "a"]]) == 1.0
    assert krippendorff_alpha_nominal([["a", N], [N, "b"]]) is None
    assert krippendorff_alpha_nominal([]) is None


def test_tag_agreement_uses_kappa_when_the_same_two_reviewers_did_every_item():
    # "slow": alice and bob agree on items 1, 2, 4 (yes, no, no) and differ on 3.
    # a = [1,0,1,0], b = [1,0,0,0]: p_o = 3/4, p_e = (2*1 + 2*3)/16 = 1/2, kappa = 1/2.
    assignments = {
        1: {"alice": {"slow"}, "bob": {"slow"}},
        2: {"alice": set(), "bob": set()},
        3: {"alice": {"slow", "rude"}, "bob": {"rude"}},
        4: {"alice": set(), "bob": set()},
        5: {"alice": {"slow"}},  # one reviewer only: nothing to compare
    }
    result = tag_agreement(assignments, ["slow", "rude", "wrong"])
    assert result["slow"].method == "kappa"
    assert result["slow"].value == pytest.approx(0.5)
    assert result["slow"].n_items == 4
    assert result["rude"].value == pytest.approx(1.0)
    assert result["wrong"].value == 1.0  # nobody used it: every decision agrees


def test_tag_agreement_uses_alpha_for_three_reviewers_with_gaps():
    assignments = {
        1: {"alice": {"slow"}, "bob": {"slow"}, "carol": {"slow"}},
        2: {"alice": set(), "bob": {"slow"}},
        3: {"bob": set(), "carol": set()},
    }
    result = tag_agreement(assignments, ["slow"])
    # Units (alice, bob, carol): (T,T,T), (F,T,-), (-,F,F); alphabetical coder order.
    expected = krippendorff_alpha_nominal(
        [[True, True, True], [False, True, None], [None, False, False]]
    )
    assert result["slow"].method == "alpha"
    assert result["slow"].n_items == 3
    assert result["slow"].value == pytest.approx(expected)
    # By hand: n = 7 (T:4, F:3); disagreement only in unit 2: 2 ordered pairs * 1 = 2.
    # alpha = 1 - 6 * 2 / (49 - 16 - 9) = 1 - 12/24 = 0.5
    assert result["slow"].value == pytest.approx(0.5)


def test_tag_agreement_without_overlapping_reviews_has_no_value():
    result = tag_agreement({1: {"alice": {"slow"}}, 2: {"bob": set()}}, ["slow"])
    assert result["slow"].value is None
    assert result["slow"].n_items == 0
