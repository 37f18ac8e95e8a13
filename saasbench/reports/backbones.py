"""Category -> backbone mapping of the paper (Appendix B.6), from one data file.

``category_to_backbone.json`` holds the six backbones, the exact dictionary (the paper's seeds,
then categories of real DAGs the seed families imply, each with its reason), the paper's prefix
rules and the paper's other wildcard seeds (``Cache*``, ``*CRUD``, ...). ``backbone_for`` tries
the exact dictionary first, then the prefix rules in order, then the seed patterns in order.
A category nothing matches returns ``None``: callers report it (``unknown_categories``), they
never fold it into a default backbone.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from fnmatch import fnmatchcase
from functools import lru_cache
from importlib import resources
from typing import Any

BACKBONES: tuple[str, ...] = ("Deploy", "Data", "API", "Logic", "AuthZ", "Quality")


@lru_cache(maxsize=1)
def mapping() -> dict[str, Any]:
    """The parsed data file (cached). Checked: every target is one of the six backbones."""
    text = resources.files("saasbench").joinpath("data/category_to_backbone.json").read_text(encoding="utf-8")
    data = json.loads(text)
    targets = list(data.get("exact", {}).values()) + list(data.get("implied", {}).values())
    targets += [r["backbone"] for r in data.get("prefix_rules", []) + data.get("seed_patterns", [])]
    bad = sorted({t for t in targets if t not in BACKBONES})
    if bad:
        raise ValueError(f"category_to_backbone.json names unknown backbones: {bad}")
    return data


@lru_cache(maxsize=4096)
def backbone_for(category: str | None) -> str | None:
    """The backbone of a node category, or None when the mapping cannot place it."""
    if not category:
        return None
    data = mapping()
    exact = data.get("exact", {})
    if category in exact:
        return exact[category]
    implied = data.get("implied", {})
    if category in implied:
        return implied[category]
    for rule in list(data.get("prefix_rules", [])) + list(data.get("seed_patterns", [])):
        if fnmatchcase(category, rule["pattern"]):
            return rule["backbone"]
    return None


def unknown_categories(categories: Iterable[str | None]) -> list[str]:
    """Sorted distinct categories (empty/None shown as '') that map to no backbone."""
    return sorted({c or "" for c in categories if backbone_for(c) is None})
