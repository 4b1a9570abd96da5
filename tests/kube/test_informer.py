"""The router's cache of a kind whose CustomResourceDefinition goes away and comes back, on the
local API server over HTTP."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from eventop.kube import Kube
from eventop.kube.backoff import Backoff
from eventop.kube.informer import Cache, InformerSpec
from eventop.kube.reflector import WatchSettings
from eventop.testing.waiting import wait_until

SNAPSHOTS = Path(__file__).resolve().parents[1] / "databases" / "schemas" / "volumesnapshots.yaml"


def test_a_kind_whose_crd_is_deleted_is_not_served_until_it_is_installed_again(
        local_kube: Any, kube: Any) -> None:
    crd = yaml.safe_load(SNAPSHOTS.read_text())
    local_kube.put(crd)
    cache = Cache(kube, [InformerSpec("snapshot.storage.k8s.io/v1", "VolumeSnapshot")],
                  settings=WatchSettings(resync_seconds=0, read_timeout=2.0, watch_timeout=1,
                                         backoff=Backoff(0.05, 0.2)),
                  missing_retry=0.2).start()
    try:
        informer = cache.informer("snapshot.storage.k8s.io/v1", "VolumeSnapshot")
        assert informer is not None
        assert wait_until(lambda: informer.synced, 10)
        assert cache.store("snapshot.storage.k8s.io/v1", "VolumeSnapshot") is not None
        local_kube.remove("apiextensions.k8s.io/v1", "CustomResourceDefinition",
                          crd["metadata"]["name"])
        # Its readers learn it is not served (the Database handler then takes a final
        # backup instead of waiting for snapshots that can never be made)
        assert wait_until(lambda: not informer.synced and informer.missing, 10)
        assert cache.store("snapshot.storage.k8s.io/v1", "VolumeSnapshot") is None
        local_kube.put(crd)
        assert wait_until(lambda: informer.synced and not informer.missing, 10)
    finally:
        cache.stop()


def test_the_routers_caches_retry_a_failing_api_server_as_often_as_the_watcher(
        local_kube: Any) -> None:
    """Capped at 30 s, a cache slept up to 24 s past the API server's return (measured on a
    real one after a 40 s outage) while the watcher was back in 4: every event in between
    waited for the cache and was answered 503."""
    from eventop.watcher.cli import build_parser

    cache = Cache(Kube.connect(url=local_kube.url), [])
    watcher = build_parser().parse_args(["run", "--sink", "http://127.0.0.1:9"])
    longest = max(cache.settings.backoff.delay(n) for n in range(40))
    assert longest <= watcher.api_backoff_max == 4.0
