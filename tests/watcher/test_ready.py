"""The delivery workers' ready keys: arrival order, per-kind shares, first in line again."""

from __future__ import annotations

from collections import deque

from hypothesis import given
from hypothesis import strategies as st

from eventop.watcher.ready import ReadyKeys


def test_keys_come_out_in_arrival_order_across_kinds() -> None:
    ready = ReadyKeys()
    for key, kind in [("a", "ConfigMap"), ("b", "Namespace"), ("c", "ConfigMap")]:
        ready.append(key, kind)
    assert [ready.take({}, 1) for _ in range(3)] == [
        ("a", "ConfigMap"), ("b", "Namespace"), ("c", "ConfigMap")]
    assert ready.take({}, 1) is None
    assert len(ready) == 0


def test_a_kind_at_its_share_is_passed_over_until_it_has_room() -> None:
    ready = ReadyKeys()
    for i in range(1000):
        ready.append(f"cm-{i}", "ConfigMap")
    ready.append("ns", "Namespace")
    assert ready.take({"ConfigMap": 4}, 4) == ("ns", "Namespace")
    assert ready.take({"ConfigMap": 4}, 4) is None
    assert len(ready) == 1000
    assert ready.take({"ConfigMap": 3}, 4) == ("cm-0", "ConfigMap")


def test_a_key_put_back_in_front_goes_before_everyone() -> None:
    ready = ReadyKeys()
    ready.append("old", "Namespace")
    ready.appendleft("interrupted", "ConfigMap")
    ready.appendleft("interrupted-later", "Secret")
    assert [ready.take({}, 1) for _ in range(3)] == [
        ("interrupted-later", "Secret"), ("interrupted", "ConfigMap"), ("old", "Namespace")]


KINDS = ["ConfigMap", "Namespace", "Secret"]
operation = st.one_of(
    st.tuples(st.just("append"), st.sampled_from(KINDS)),
    st.tuples(st.just("appendleft"), st.sampled_from(KINDS)),
    st.tuples(st.just("take"), st.fixed_dictionaries({k: st.integers(0, 3) for k in KINDS})),
)


@given(st.lists(operation, max_size=60), st.integers(1, 3))
def test_take_returns_what_a_scan_of_one_line_in_arrival_order_returns(
        operations: list[tuple[str, object]], limit: int) -> None:
    """The structure it replaced: one deque, scanned for the first key of a kind with room."""
    ready, line = ReadyKeys(), deque[tuple[str, str]]()
    for n, (op, arg) in enumerate(operations):
        if op == "append":
            ready.append(f"k{n}", str(arg))
            line.append((f"k{n}", str(arg)))
        elif op == "appendleft":
            ready.appendleft(f"k{n}", str(arg))
            line.appendleft((f"k{n}", str(arg)))
        else:
            busy = dict(arg)  # type: ignore[call-overload]
            expected = next(((i, item) for i, item in enumerate(line)
                             if busy.get(item[1], 0) < limit), None)
            if expected is not None:
                del line[expected[0]]
            assert ready.take(busy, limit) == (expected[1] if expected else None)
        assert len(ready) == len(line)
