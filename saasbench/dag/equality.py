"""Equality of app data with DAG data: one module, two named semantics.

- ``strict`` (P07 and the HTTP primitives, :func:`strict_equal`): null matches null or absent;
  booleans match booleans only; a number and a numeric string compare as numbers within
  ``tolerance``; strings compare exactly; objects and arrays compare deeply.
- ``loose`` (P08-P11, database rows, :func:`loose_equal`): what drivers return is text, 0/1 bits
  and JSON in strings, so "true"/1, "42"/42 and a JSON string/object are equal; other values
  compare as trimmed text.

They differ on purpose (docs/dag-semantics.md): a JSON body keeps its types, a database row does not.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, Literal

from saasbench.dag.jsonpath import ABSENT
from saasbench.dag.placeholders import MISSING, to_text

_NUMBER = re.compile(r"^\s*[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?\s*$")


def values_equal(
    actual: Any, expected: Any, *, mode: Literal["strict", "loose"] = "strict", tolerance: float | None = None
) -> bool:
    """``actual`` (from the app) equals ``expected`` (from the DAG) under ``mode``."""
    return strict_equal(actual, expected, tolerance) if mode == "strict" else loose_equal(actual, expected)


# --- strict ------------------------------------------------------------------------------------------
def number(value: Any) -> float | Decimal | None:
    """A number, or a numeric string, as a number; booleans and everything else -> None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float, Decimal)):
        return value
    if isinstance(value, str) and value.strip():
        try:
            number = Decimal(value.strip())
        except ArithmeticError:
            return None
        return number if number.is_finite() else None
    return None


def exact_decimal(value: float | Decimal) -> Decimal | None:
    """Exact decimal of a number (floats via their shortest repr); None for NaN/infinity."""
    number = (
        value if isinstance(value, Decimal) else Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
    )
    return number if number.is_finite() else None


def strict_equal(actual: Any, expected: Any, tolerance: float | None = None) -> bool:
    """Equality of app data with DAG data.

    null matches null or absent; booleans match booleans only; a number and a numeric string
    are compared as numbers (DB drivers and some APIs return numerics as strings), within
    ``tolerance``; strings compare exactly; objects and arrays compare deeply with these rules.
    """
    if expected is None:
        return actual is None or actual is ABSENT
    if actual is ABSENT:
        return False
    if isinstance(expected, bool) or isinstance(actual, bool):
        return isinstance(expected, bool) and isinstance(actual, bool) and actual == expected
    if isinstance(expected, (int, float, Decimal)) or isinstance(actual, (int, float, Decimal)):
        a, e = number(actual), number(expected)
        if a is None or e is None:
            return False
        da, de = exact_decimal(a), exact_decimal(e)
        if da is None or de is None:
            return False
        tol = exact_decimal(float(tolerance or 0))  # a NaN/infinite tolerance compares nothing equal
        return tol is not None and abs(da - de) <= tol
    if isinstance(expected, str) or isinstance(actual, str):
        return isinstance(actual, str) and isinstance(expected, str) and actual == expected
    if isinstance(expected, Mapping) and isinstance(actual, Mapping):
        return set(expected) == set(actual) and all(strict_equal(actual[k], expected[k], tolerance) for k in expected)
    if isinstance(expected, (list, tuple)) and isinstance(actual, (list, tuple)):
        return len(expected) == len(actual) and all(strict_equal(a, e, tolerance) for a, e in zip(actual, expected))
    return actual == expected


# --- loose -------------------------------------------------------------------------------------------
def numeric(v: Any) -> Decimal | float | None:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int):
        return Decimal(v)
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, Decimal):
        return v if v.is_finite() else None
    if isinstance(v, str) and _NUMBER.match(v):
        return Decimal(v.strip())
    return None


def cmp_num(a: Any, b: Any) -> int | None:
    x, y = numeric(a), numeric(b)
    if x is None or y is None:
        return None
    if isinstance(x, float) or isinstance(y, float):
        fx, fy = float(x), float(y)
        if math.isclose(fx, fy, rel_tol=1e-9, abs_tol=1e-12):
            return 0
        return -1 if fx < fy else 1
    return (x > y) - (x < y)


def as_bool(v: Any) -> bool | None:
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    if isinstance(v, str):
        low = v.strip().lower()
        if low in ("true", "t", "yes", "y", "on", "1"):
            return True
        if low in ("false", "f", "no", "n", "off", "0"):
            return False
    return None


def _bool_word_vs_bit(word: Any, bit: Any) -> bool:
    """``"True"``/``"false"`` against a 0/1 integer (MySQL and SQLite store booleans as 0/1)."""
    return (
        isinstance(word, str)
        and word.strip().lower() in ("true", "false")
        and isinstance(bit, int)
        and not isinstance(bit, bool)
        and bit in (0, 1)
    )


def parse_json(v: Any) -> Any:
    if isinstance(v, str):
        try:
            return json.loads(v)
        except (json.JSONDecodeError, ValueError):
            return MISSING
    return v


def loose_equal(actual: Any, expected: Any) -> bool:
    if expected is None:
        return actual is None
    if actual is None or actual is MISSING:
        return False
    if (
        isinstance(expected, bool)
        or isinstance(actual, bool)
        or _bool_word_vs_bit(actual, expected)
        or _bool_word_vs_bit(expected, actual)
    ):
        a, e = as_bool(actual), as_bool(expected)
        return a is not None and e is not None and a == e
    c = cmp_num(actual, expected)
    if c is not None:
        return c == 0
    if isinstance(expected, (dict, list)):
        return _json_equal(parse_json(actual), expected)
    if isinstance(actual, (dict, list)):
        parsed = parse_json(expected)
        if parsed is not MISSING and isinstance(parsed, (dict, list)):
            return _json_equal(actual, parsed)
        return False
    return to_text(actual).strip() == to_text(expected).strip()


def _json_equal(a: Any, b: Any) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, (dict, list)) or isinstance(b, (dict, list)):
        return False
    return loose_equal(a, b)
