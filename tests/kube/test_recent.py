"""The bounded memory of the recent past (kube/recent.py)."""

from __future__ import annotations

from eventop.kube.recent import Recent


def test_the_oldest_entry_is_forgotten_first_and_a_put_makes_one_the_newest() -> None:
    recent: Recent[str, int] = Recent(2)
    recent.put("a", 1)
    recent.put("b", 2)
    recent.put("a", 3)  # a is now the newest
    recent.put("c", 4)  # over the limit: b, the oldest, goes
    assert "b" not in recent and recent.get("a") == 3 and recent.get("c") == 4
    assert len(recent) == 2
    assert recent.pop("a") == 3 and recent.pop("a", 0) == 0
