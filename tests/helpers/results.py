"""Reading results: a PartitionProcessor's result outputs decoded, one command's answer, and a result as the
outcome or the rejection reason (what most assertions compare)."""
from __future__ import annotations

from schemas.codec import codec

C = codec()


def results(outputs) -> list[dict]:
    return [C.decode("result", o.value) for o in outputs if o.topic == "results"]


def answer(outputs, command_id: str) -> dict:
    """The one decision (not a duplicate) among the outputs for command_id."""
    found = [r for r in results(outputs) if r["command_id"] == command_id and not r["duplicate"]]
    assert len(found) == 1, (command_id, results(outputs))
    return found[0]


def outcome(result: dict) -> str:
    """"accepted", or the rejection's reason."""
    return result["outcome"] if result["outcome"] == "accepted" else result["reason"]
