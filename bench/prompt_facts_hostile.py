"""Time parse_prompt_for_model on hostile inputs (the agent-facing prompt is data the harness reads).

Each input made an early version of the parser backtrack for 50 s to hours; the bounded patterns
must stay linear. Run: .venv/bin/python bench/prompt_facts_hostile.py (numbers: docs/benchmarks.md).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_prompt_facts import HOSTILE  # noqa: E402

from saasbench.catalog.prompt_facts import parse_prompt_for_model  # noqa: E402


def main() -> None:
    worst = 0.0
    for name, text in sorted(HOSTILE.items()):
        started = time.perf_counter()
        parse_prompt_for_model(text)
        took = time.perf_counter() - started
        worst = max(worst, took)
        print(f"{name:<14} {len(text):>9,} chars  {took * 1000:8.1f} ms")
    print(f"worst {worst * 1000:.1f} ms")


if __name__ == "__main__":
    main()
