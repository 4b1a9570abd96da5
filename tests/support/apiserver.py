"""The local API server as the tests start it: one place, so every fixture starts it alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eventop.localkube import LocalKube

CRDS = Path(__file__).resolve().parents[2] / "crds"


def local_kube_server(**options: Any) -> LocalKube:
    """A :class:`LocalKube` with the repository's CRDs installed, not started yet.

    Use it as a context manager (``with local_kube_server() as server:``): it is started on
    entry and stopped, with its watches, connections and threads, on exit. ``options`` go
    to :class:`LocalKube` (e.g. ``bookmark_interval=0.1`` for fast bookmarks).
    """
    return LocalKube(crd_dir=str(CRDS), **options)
