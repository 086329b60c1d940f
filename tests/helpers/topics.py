"""What the tests read back from a real broker's topics."""
from __future__ import annotations

from projections.topics import latest_per_account, read_topic


def latest_balances(settings) -> dict[str, dict]:
    """Each account's latest record on the balances topic (its value)."""
    return {account: r.value for account, r in latest_per_account(read_topic(settings, "balances")).items()}
