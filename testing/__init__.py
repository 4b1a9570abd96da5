"""eventop's test kit: test your handlers the way they run, from your own project.

``pip install "eventop[testing]"`` and its pytest plugin (:mod:`eventop.testing.plugin`) gives
your tests the fixtures ``eventop_cluster`` (a local API server, or the cluster named by
``EVENTOP_TEST_KUBECONFIG``), ``eventop_router`` (the router running your handlers, you send
the events) and ``eventop_pipeline`` (the router and the watcher as real processes). The
pieces are importable for anything else:

* :class:`Cluster`, :class:`LocalCluster`, :class:`RealCluster`: the API server's verbs;
* :class:`Pipeline`: the router (and the watcher) for a cluster; ``post``, ``replay``, logs;
* :func:`replay`, :func:`recorded_changes`: recordings (``python -m eventop.watcher record``)
  replayed in order, shuffled or duplicated;
* :class:`RouterProcess`, :class:`WatcherProcess`: the processes themselves;
  :func:`metric_samples`: what their ``/metrics`` count (the API requests made, say);
* :func:`eventually`, :func:`wait_until`: waiting for a converging cluster.

For a handler's pure function, without any server, see :mod:`eventop.engine.testing`.
Names are imported lazily: the plugin is loaded by every pytest run where eventop is
installed, and must cost nothing there.
"""

from __future__ import annotations

from eventop import lazy_exports

_EXPORTS = {
    "Cluster": "eventop.testing.cluster",
    "LocalCluster": "eventop.testing.cluster",
    "RealCluster": "eventop.testing.cluster",
    "world_copy": "eventop.testing.cluster",
    "Pipeline": "eventop.testing.pipeline",
    "replay": "eventop.testing.recordings",
    "recorded_changes": "eventop.testing.recordings",
    "RouterProcess": "eventop.testing.processes",
    "WatcherProcess": "eventop.testing.processes",
    "free_port": "eventop.testing.processes",
    "metric_samples": "eventop.testing.processes",
    "eventually": "eventop.testing.waiting",
    "wait_until": "eventop.testing.waiting",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports("eventop.testing", _EXPORTS, globals())
