"""The router's cache of a kind whose CustomResourceDefinition goes away and comes back, on the
local API server over HTTP."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import yaml

from eventop.kube import Kube
from eventop.kube.backoff import Backoff
from eventop.kube.informer import Cache, Informer, InformerSpec
from eventop.kube.metrics import KUBE_REQUESTS
from eventop.kube.reflector import WatchSettings
from eventop.testing.waiting import wait_until

SNAPSHOTS = Path(__file__).resolve().parents[1] / "databases" / "schemas" / "volumesnapshots.yaml"
SNAPSHOT_KIND = ("snapshot.storage.k8s.io/v1", "VolumeSnapshot")


def snapshot_cache(kube: Any, missing_retry: float, *,
                   optional: bool = False) -> tuple[Cache, Informer]:
    """A started cache of VolumeSnapshots with quick watches, and its informer."""
    cache = Cache(kube, [InformerSpec(*SNAPSHOT_KIND, optional=optional)],
                  settings=WatchSettings(resync_seconds=0, read_timeout=2.0, watch_timeout=1,
                                         backoff=Backoff(0.05, 0.2)),
                  missing_retry=missing_retry).start()
    informer = cache.informer(*SNAPSHOT_KIND)
    assert informer is not None
    return cache, informer


def test_a_kind_whose_crd_is_deleted_is_not_served_until_it_is_installed_again(
        local_kube: Any, kube: Any, caplog: Any) -> None:
    import logging

    crd = yaml.safe_load(SNAPSHOTS.read_text())
    local_kube.put(crd)
    cache, informer = snapshot_cache(kube, missing_retry=0.2)
    try:
        assert wait_until(lambda: informer.synced, 10)
        assert cache.store(*SNAPSHOT_KIND) is not None
        with caplog.at_level(logging.INFO, logger="eventop"):
            local_kube.remove("apiextensions.k8s.io/v1", "CustomResourceDefinition",
                              crd["metadata"]["name"])
            # Its readers learn it is not served (the Database handler then takes a final
            # backup instead of waiting for snapshots that can never be made)
            assert wait_until(lambda: not informer.synced and informer.missing, 10)
            assert cache.store(*SNAPSHOT_KIND) is None
            local_kube.put(crd)
            assert wait_until(lambda: informer.synced and not informer.missing, 10)
        # one warning that it is gone, one line that it is back (the watch loop said both
        # too, in other words)
        said = [(r.levelname, r.getMessage()) for r in caplog.records
                if r.levelno >= logging.INFO and "cached" not in r.getMessage()]
        assert [level for level, _ in said] == ["WARNING", "INFO"], said
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


def test_an_event_of_a_kind_not_served_makes_its_cache_look_again_at_once(
        local_kube: Any, kube: Any) -> None:
    """CRDs installed after the router started: the first event of the kind (the watcher's,
    or a Knative source's) is answered 503 while the cache does not serve it, and its
    redelivery, 0.2 s to a few seconds later, must not wait out the next poll (10 s)."""
    crd = yaml.safe_load(SNAPSHOTS.read_text())
    cache, informer = snapshot_cache(kube, missing_retry=60.0)
    try:
        assert wait_until(lambda: informer.missing, 10)
        local_kube.put(crd)
        informer.look_again()
        assert wait_until(lambda: informer.synced and not informer.missing, 10)
    finally:
        cache.stop()


def test_stopping_a_cache_that_waits_for_a_kind_to_be_served_ends_its_watch_at_once(
        local_kube: Any, kube: Any) -> None:
    cache, informer = snapshot_cache(kube, missing_retry=60.0)
    assert wait_until(lambda: informer.missing, 10)
    cache.stop(join_seconds=5.0)
    assert not informer.reflector.running


def test_an_optional_kind_not_served_is_looked_for_once_a_minute_not_every_poll(
        kube: Any) -> None:
    """Without the snapshot API, each router asked discovery every 10 s, forever (a trial
    counted 20 404s in 198 s per replica): an add-on's kind is looked for once a minute."""
    def discoveries() -> float:
        return sum(sample.value for metric in KUBE_REQUESTS.collect()
                   for sample in metric.samples
                   if sample.name.endswith("_total") and sample.labels["verb"] == "discovery")

    for optional, most in ((False, None), (True, 1)):
        before = discoveries()
        cache, informer = snapshot_cache(kube, missing_retry=0.2, optional=optional)
        try:
            assert wait_until(lambda i=informer: i.missing, 10)
            time.sleep(1.5)
            asked = discoveries() - before
        finally:
            cache.stop()
        if most is None:
            assert asked >= 4  # polled every 0.2 s
        else:
            assert asked <= most
