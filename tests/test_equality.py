"""The one equality module (saasbench/dag/equality.py): its two named semantics side by side."""

from __future__ import annotations

import pytest

from saasbench.dag.equality import values_equal
from saasbench.dag.jsonpath import ABSENT


@pytest.mark.parametrize(
    ("actual", "expected", "strict", "loose"),
    [
        (42, "42", True, True),  # numeric strings compare as numbers in both
        (1, True, False, True),  # a 0/1 bit is a boolean only in database rows
        ("true", True, False, True),
        ("  abc ", "abc", False, True),  # rows are compared as trimmed text
        ('{"a": 1}', {"a": 1}, False, True),  # JSON kept in a text column
        (None, None, True, True),
        (ABSENT, None, True, False),  # an absent JSON key is null; a row value is never "absent"
        (1.0000001, 1, False, False),
        ({"a": [1, "2"]}, {"a": [1, 2]}, True, True),
    ],
)
def test_strict_and_loose(actual, expected, strict: bool, loose: bool) -> None:
    assert values_equal(actual, expected, mode="strict") is strict
    assert values_equal(actual, expected, mode="loose") is loose


def test_tolerance_is_strict_only_and_a_nan_tolerance_matches_nothing() -> None:
    assert values_equal(1.05, 1, tolerance=0.1) and not values_equal(1.05, 1)
    assert not values_equal(1, 1, tolerance=float("nan"))
