"""The keys waiting for a delivery worker: oldest first, but never more than a kind's share.

The :class:`~eventop.watcher.delivery.Deliverer` lets one kind hold at most ``max_per_kind``
workers. Its ready keys used to wait in a single deque that every take scanned from the front
for the first key whose kind was under its share. In a fan-out (a source copied into 1,000
namespaces: 1,000 ConfigMap echoes ready at once) the ConfigMaps' share is full nearly all the
time, so each take, and each worker woken to look, walked past every waiting ConfigMap: work
quadratic in the backlog, 30% of the watcher's CPU (py-spy, GIL samples) while the API server
needed those cores for the writes.

Here each kind keeps its own first-in-first-out line and every key carries a ticket from one
counter, so a take compares only the first key of each kind (there are a handful of kinds)
and returns exactly the key the scan returned: the oldest whose kind may start one more.
"""

from __future__ import annotations

import itertools
from collections import deque


class ReadyKeys:
    """Keys in arrival order, one line per kind; :meth:`take` respects per-kind shares."""

    def __init__(self) -> None:
        self._lines: dict[str, deque[tuple[int, str]]] = {}
        self._tickets = itertools.count()  # append: after everyone
        self._front = itertools.count(-1, -1)  # appendleft: before everyone
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def append(self, key: str, kind: str) -> None:
        """``key`` waits behind every key already waiting."""
        self._lines.setdefault(kind, deque()).append((next(self._tickets), key))
        self._size += 1

    def appendleft(self, key: str, kind: str) -> None:
        """``key`` goes first again (its delivery was interrupted by the sink going down)."""
        self._lines.setdefault(kind, deque()).appendleft((next(self._front), key))
        self._size += 1

    def take(self, busy: dict[str, int], limit: int) -> tuple[str, str] | None:
        """The oldest key whose kind has fewer than ``limit`` workers in ``busy``, removed,
        with its kind; None when every waiting kind is at its share."""
        chosen: str | None = None
        first = 0
        for kind, line in self._lines.items():
            if busy.get(kind, 0) < limit and (chosen is None or line[0][0] < first):
                chosen, first = kind, line[0][0]
        if chosen is None:
            return None
        line = self._lines[chosen]
        key = line.popleft()[1]
        if not line:
            del self._lines[chosen]
        self._size -= 1
        return key, chosen
