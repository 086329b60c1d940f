"""Hypothesis budgets. `make test` uses the numbers as written; `make mutate` (HYPOTHESIS_PROFILE=mutation, see
tests/conftest.py) runs every test once per mutant and takes a fifth of them, so the whole run stays short."""
from __future__ import annotations

import os

MUTATION_RUN = os.environ.get("HYPOTHESIS_PROFILE") == "mutation"


def examples(n: int) -> int:
    """The number of Hypothesis examples for a test that asks for n."""
    return max(20, n // 5) if MUTATION_RUN else n
