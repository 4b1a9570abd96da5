"""A bounded, thread-safe mapping that forgets its oldest entries first.

What a long-running process remembers about the recent past must not grow with the
cluster's history: the resourceVersions of the engine's own writes, the changes its watch
acted on, a key's last successful run, the deletions a cache saw, a provider's ETags. Each is
a :class:`Recent` with a limit.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class Recent(Generic[K, V]):
    """Up to ``limit`` entries; putting one makes it the newest, the oldest go first."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._items: OrderedDict[K, V] = OrderedDict()

    def put(self, key: K, value: V) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.limit:
                self._items.popitem(last=False)

    def get(self, key: K, default: V | None = None) -> V | None:
        with self._lock:
            return self._items.get(key, default)

    def pop(self, key: K, default: V | None = None) -> V | None:
        with self._lock:
            return self._items.pop(key, default)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._items

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)
