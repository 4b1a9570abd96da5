"""A tiny scheduler for controller work that a real cluster does a little later.

Used for namespace termination when ``LocalKube(namespace_delay=...)`` is set, so tests can
see the window in which a namespace is Terminating but still has content (as on a real
cluster, where the namespace controller takes seconds). ``wait_idle`` lets a test wait for
all of it to be done.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable


class Deferred:
    """Run callables after a delay, one at a time, in one background thread."""

    def __init__(self, name: str = "localkube-controllers") -> None:
        self._cond = threading.Condition()
        self._queue: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self._running = False
        self._stopped = False
        self._thread: threading.Thread | None = None
        self._name = name

    @property
    def stopped(self) -> bool:
        return self._stopped

    def schedule(self, delay: float, work: Callable[[], None]) -> None:
        with self._cond:
            if self._stopped:
                return
            heapq.heappush(self._queue, (time.monotonic() + delay, next(self._order), work))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopped and (
                        not self._queue or self._queue[0][0] > time.monotonic()):
                    wait = self._queue[0][0] - time.monotonic() if self._queue else None
                    self._cond.wait(wait)
                if self._stopped:
                    return
                _, _, work = heapq.heappop(self._queue)
                self._running = True
            try:
                work()
            finally:
                with self._cond:
                    self._running = False
                    self._cond.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Block until nothing is queued or running; False if ``timeout`` passed first."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._queue or self._running:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._queue.clear()
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()
