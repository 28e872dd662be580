"""Agreement between reviewers: Cohen's kappa, Krippendorff's alpha, and both applied to tags.

Pure functions over plain data, no Django. Degenerate cases follow one rule: when every
rating falls in the same category the chance-corrected statistic is 0/0; we call that perfect
agreement (1.0), since nobody disagreed. With nothing to compare the result is None.
"""

from collections import Counter
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import permutations


def cohens_kappa(labels_a: Sequence[Hashable], labels_b: Sequence[Hashable]) -> float | None:
    """Cohen's kappa of two raters' paired labels (binary or any categories).

    1.0 when both raters used one and the same category throughout; None when there are no pairs.
    """
    if len(labels_a) != len(labels_b):
        raise ValueError("kappa needs one label from each rater per item")
    n = len(labels_a)
    if n == 0:
        return None
    observed = sum(a == b for a, b in zip(labels_a, labels_b, strict=True)) / n
    counts_a, counts_b = Counter(labels_a), Counter(labels_b)
    expected = sum(counts_a[label] * counts_b[label] for label in counts_a) / (n * n)
    if expected == 1:
        return 1.0
    return (observed - expected) / (1 - expected)


def krippendorff_alpha_nominal(units: Iterable[Sequence[Hashable | None]]) -> float | None:
    """Krippendorff's alpha for nominal data: one row per unit, one value per coder or None.

    Any number of coders; a unit with fewer than two values cannot be paired and is left out.
    1.0 when all pairable values are the same category; None when nothing can be paired.
    """
    # The coincidence matrix: each unit with m values adds every ordered pair of its values,
    # weighted 1/(m-1), so each unit contributes m pairable values in all.
    coincidences: Counter = Counter()
    for unit in units:
        values = [value for value in unit if value is not None]
        if len(values) < 2:
            continue
        weight = 1 / (len(values) - 1)
        for first, second in permutations(values, 2):
            coincidences[first, second] += weight
    marginals: Counter = Counter()
    for (first, _), weight in coincidences.items():
        marginals[first] += weight
    n = sum(marginals.values())
    if n == 0:
        return None
    observed_disagreement = sum(w for (c, k), w in coincidences.items() if c != k)
    expected_disagreement = (n * n - sum(count * count for count in marginals.values())) / (n - 1)
    if expected_disagreement == 0:
        return 1.0
    return 1 - observed_disagreement / expected_disagreement


@dataclass(frozen=True)
class TagAgreement:
    method: str  # "kappa" (the same two reviewers on every item) or "alpha"
    value: float | None
    n_items: int  # items rated by at least two reviewers


def tag_agreement(
    assignments: Mapping[Hashable, Mapping[Hashable, set]], tags: Iterable[Hashable]
) -> dict[Hashable, TagAgreement]:
    """Per tag, agreement on the binary "has this tag" decision over items with 2+ reviewers.

    `assignments` maps item -> reviewer -> the set of tags that reviewer put on the item (an
    empty set is a rating too: every tag absent). Cohen's kappa when exactly the same two
    reviewers rated every such item, Krippendorff's alpha otherwise (more reviewers, or
    different pairs, leave gaps that alpha handles as missing values).
    """
    rated = {
        item: by_reviewer for item, by_reviewer in assignments.items() if len(by_reviewer) >= 2
    }
    reviewers = sorted({reviewer for by in rated.values() for reviewer in by}, key=str)
    pairs_only = len(reviewers) == 2
    result = {}
    for tag in tags:
        if pairs_only:
            first, second = reviewers
            value = cohens_kappa(
                [tag in by[first] for by in rated.values()],
                [tag in by[second] for by in rated.values()],
            )
            result[tag] = TagAgreement("kappa", value, len(rated))
        else:
            units = [
                [tag in by[reviewer] if reviewer in by else None for reviewer in reviewers]
                for by in rated.values()
            ]
            result[tag] = TagAgreement("alpha", krippendorff_alpha_nominal(units), len(rated))
    return result
