"""The due-time index behind hold expiries and copies' waits (streams/due.py), broker-free."""
from __future__ import annotations

from hypothesis import given, strategies as st

from streams.due import DueIndex


def test_items_come_up_once_earliest_first_and_only_while_live():
    index = DueIndex([("a", 30), ("b", 10)])
    index.put("c", 20)
    index.put("c", 20)  # indexed twice (a hold staged twice in one batch): comes up once
    index.drop("b")
    assert not index.take_due(9)
    assert index.due_by(10)  # b's entry is still on the heap: the check may say so, the take skips it
    assert index.take_due(25) == [(20, "c")]
    assert index.take_due(25) == []  # taken: not again, though still live
    assert index.get("c") == 20 and len(index) == 2
    index.put("c", 20)  # taken while it could not be acted on (a locked hold): indexed again, it comes up again
    assert index.take_due(40) == [(20, "c"), (30, "a")]


def test_a_drop_names_the_due_time_it_ends():
    """A copy's wait record deleted for an older due time does not end a newer wait of the same transaction."""
    index = DueIndex()
    index.put("t", 10)
    index.put("t", 50)
    index.drop("t", 10)
    assert index.get("t") == 50
    assert index.take_due(20) == []
    assert index.take_due(60) == [(50, "t")]
    index.drop("t", 50)
    assert index.get("t") is None and len(index) == 0


@given(st.lists(st.tuples(st.sampled_from(["put", "drop", "take"]), st.integers(0, 7), st.integers(0, 200)),
                max_size=400))
def test_what_comes_up_is_what_a_plain_map_says_is_due(ops):
    """Against a model: every take returns exactly the live items due by then that were put (again) since their
    last take, earliest first; compaction of the heap changes nothing."""
    index, live, pending = DueIndex(), {}, set()
    for op, n, t in ops:
        item = f"i{n}"
        if op == "put":
            index.put(item, t)
            live[item] = t
            pending.add(item)
        elif op == "drop":
            index.drop(item)
            live.pop(item, None)
            pending.discard(item)
        else:
            expected = sorted((live[i], i) for i in pending if i in live and live[i] <= t)
            assert index.take_due(t) == expected
            pending -= {i for _, i in expected}
        assert index.live == live


def test_stale_entries_are_thrown_away_when_they_outnumber_the_live():
    """A hold staged many times while open (captures) is indexed each time: the heap stays within about twice
    the live items, not one entry per stage."""
    index = DueIndex()
    for n in range(10_000):
        index.put("h", 10)
        index.put(f"x{n % 3}", 20)
    assert len(index) == 4 and index.queued <= 2 * len(index) + 65
    assert index.take_due(30) == [(10, "h"), (20, "x0"), (20, "x1"), (20, "x2")]
