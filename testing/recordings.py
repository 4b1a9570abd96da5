"""Replay recorded Kubernetes traffic (what ``python -m eventop.watcher record`` writes).

A recording is a folder (or files) of ``*.list.json`` (the LIST: the state at the start) and
``*.watch.jsonl`` (the watch events that followed). :func:`replay` makes those changes
happen again on a test's API server and hands each one to ``deliver`` (post it to the router,
or call a handler), in one of three orders, because a handler must converge to the same
state whichever way its events arrive:

* ``in_order``: each change made, then delivered, one by one (what our watcher does);
* ``shuffled``: every change made first, in order, then every event delivered in a random
  (seeded) order: unordered delivery, as on Knative;
* ``duplicated``: in order, each event delivered twice: at-least-once delivery.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from eventop.testing.cluster import Cluster
from eventop.watcher.recording import load_initial, load_recording

Obj = dict[str, Any]
T = TypeVar("T")
ORDERS = ("in_order", "shuffled", "duplicated")


def recorded_changes(paths: str | Path | Iterable[str | Path]) -> list[tuple[str, Obj]]:
    """The recording as ``(change, object)``: its listed objects as ``add``, then its watch
    events in resourceVersion order (``add``/``update``/``delete``)."""
    given = [paths] if isinstance(paths, str | Path) else list(paths)
    return [("add", obj) for obj in load_initial(given)] + load_recording(given)


def make_change(cluster: Cluster, change: str, obj: Obj) -> Obj:
    """Change ``cluster`` as the recorded change did (a namespace that turned Terminating is
    deleted: the API server then terminates it as it did when recorded); return the object
    a watch of *this* API server would carry: as stored (its resourceVersion is this
    server's, which the router's cache is compared with, not the recording's), or, for a
    removal, the recorded object without a resourceVersion."""
    meta = obj["metadata"]
    if change == "delete" or (obj["kind"] == "Namespace" and meta.get("deletionTimestamp")):
        cluster.remove(obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace"))
        gone = copy.deepcopy(obj)
        gone["metadata"].pop("resourceVersion", None)
        return gone
    stored = cluster.put(obj)
    return stored if isinstance(stored, dict) and stored.get("metadata") else obj


def replay(cluster: Cluster, paths: str | Path | Iterable[str | Path],
           deliver: Callable[[str, Obj], T], *, order: str = "in_order", seed: int = 0,
           after_each: Callable[[str, Obj], None] | None = None) -> list[T]:
    """Make the recorded changes on ``cluster`` and ``deliver(change, obj)`` each (``obj``
    as :func:`make_change` returns it), in ``order`` (see the module docstring); returns what
    ``deliver`` returned.

    ``after_each(change, recorded)`` (``in_order`` only) runs after each delivery, once the
    API server settled: the place for assertions about the states in between.
    """
    if order not in ORDERS:
        raise ValueError(f"order must be one of {', '.join(ORDERS)}, not {order!r}")
    changes = recorded_changes(paths)
    answers: list[T] = []
    if order == "shuffled":
        served = [(change, make_change(cluster, change, obj)) for change, obj in changes]
        cluster.settle()
        random.Random(seed).shuffle(served)
        answers = [deliver(change, obj) for change, obj in served]
    else:
        for change, obj in changes:
            sent = make_change(cluster, change, obj)
            answers.append(deliver(change, sent))
            if order == "duplicated":
                answers.append(deliver(change, sent))
            if after_each is not None:
                cluster.settle()
                after_each(change, obj)
    cluster.settle()
    return answers
