"""Has the router's cache seen an event's change? The bounded wait before an event's runs.

A run reads the cache, never the event's body, so an event is run only once the cache of its
kind holds the change it announces (its resourceVersion, compared as integers as client-go's
consistent reads from cache do), or has dropped the object it deletes. Past the bound the
event is answered 503 (:class:`CacheBehind`) and sent again: a change is never lost. Where
waiting could never end (a Reference-mode event with no version, a version that is not an
integer, one the API server itself has not reached, a delete of an object that is alive),
the API server is asked once (a list by name) and the event is run on the object as it is.
See ``docs/ENGINE.md`` section 5.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from eventop.handlers.events import Event
from eventop.kube import errors
from eventop.kube.client import Kube
from eventop.kube.informer import Cache
from eventop.kube.objects import name_selector
from eventop.kube.store import rv_int

log = logging.getLogger("eventop.engine")

Obj = dict[str, Any]


class CacheBehind(errors.Unavailable):
    """The cache did not catch up with an event in time: the event is answered 503."""


class CatchUp:
    """The wait for ``cache`` to have seen an event, at most ``wait()`` seconds per step."""

    def __init__(self, cache: Cache, kube: Kube, wait: Callable[[], float]) -> None:
        self.cache = cache
        self.kube = kube
        self.wait = wait

    def caught_up(self, event: Event, kind: tuple[str, str]) -> tuple[Obj, float | None]:
        """Wait (bounded) until the cache of the event's kind has seen its change; returns
        the object as the cache holds it (the event's own data if gone) and when the cache
        learned that version (or the deletion): a run started since then has seen it."""
        ref = event.ref
        assert ref is not None
        informer = self.cache.informer(*kind)
        assert informer is not None
        body = event.object or {"apiVersion": ref.api_version, "kind": ref.kind,
                                "metadata": {"name": ref.name, "namespace": ref.namespace,
                                             "uid": ref.uid}}
        rv = ref.resource_version
        if rv is not None and rv_int(rv) is None and informer.store is not None \
                and rv_int(informer.store.resource_version) is not None:
            # Not a version this API server writes (its are integers): a malformed or forged
            # event. Waiting for it would end in a 503 retried forever; ask the API server
            # for the object's current version instead, as for a Reference-mode event.
            rv = None
        # What the informer's label selector is checked against: a Reference-mode event
        # carries no labels, so the object the cache holds under that name stands in (a
        # label-selected kind's deletion was otherwise not waited for, and the run read the
        # object the cache still held: a deleted DaemonSet not made again).
        probe = body
        if event.object is None and informer.store is not None:
            probe = informer.store.get(ref.namespace, ref.name) or body
        deleted = event.change == "delete"
        if rv is None and informer.synced and informer.store is not None:
            # A Reference-mode event names an object, not a version: the cache must reach the
            # *object's* resourceVersion as the API server holds it now (one list by name).
            # Not the list's: the newest of the whole API server, which the watch of a kind
            # nobody changes reaches only with a bookmark (minutes apart on v1.24), so every
            # such event would wait out ``cache_wait`` and be answered 503.
            current = self.read_meta(ref.api_version, ref.kind, ref.namespace, ref.name)
            if current is None:
                deleted = True  # gone: the cache must not hold it any more (any uid)
            else:
                rv = str(current.get("resourceVersion") or "") or None
                if ref.uid is None or current.get("uid") == ref.uid:
                    # A delete of an object that is there (made again under its name, the
                    # older delete delivered late, as Knative may): the cache must reach
                    # what is there, not drop it (it never would: 10 s, then a lookup).
                    deleted = False
        if deleted and rv is not None and self._alive(event, informer, rv):
            deleted = False  # run on the object as the cache holds it, at once
        if informer.matches(probe) and not informer.wait_for(
                rv, body, self.wait(), deleted=deleted) \
                and not (deleted and self.exists(ref)):
            now = self._ahead_of_server(event, rv)
            if now is None or not informer.wait_for(now[0], body, self.wait(),
                                                    deleted=now[1]):
                raise CacheBehind(f"the cache of {ref.kind} did not reach resourceVersion "
                                  f"{rv} within {self.wait():.0f}s; send the "
                                  "event again")
            rv, deleted = now
        store = informer.store
        held = store.get(ref.namespace, ref.name) if store is not None else None
        since = store.learned_at(held if held is not None else body, rv, deleted=deleted) \
            if store is not None and informer.matches(probe) else None
        return (held if held is not None else body), since

    def _ahead_of_server(self, event: Event, rv: str | None) -> tuple[str | None, bool] | None:
        """An event whose version the API server has not even reached (a forged event, or one
        from another cluster): the object's version as the API server holds it now, and
        whether it is gone; the event is then run on that, as a Reference-mode event is. None
        for a version the API server has reached: the cache is behind (a 503, sent again).
        Without this, such an event would be answered 503 and sent again forever."""
        ref = event.ref
        assert ref is not None
        wanted = rv_int(rv) if rv is not None else None
        if wanted is None:
            return None
        page = self._by_name(ref.api_version, ref.kind, ref.namespace, ref.name)
        server = rv_int(str((page.get("metadata") or {}).get("resourceVersion") or ""))
        if server is None or server >= wanted:
            return None
        items = page.get("items") or []
        current = str((items[0].get("metadata") or {}).get("resourceVersion") or "") or None \
            if items else None
        log.warning("event %s claims resourceVersion %s, which the API server has not reached "
                    "(it is at %s): not a change of this cluster (forged, or sent to the wrong "
                    "router); run on %s %s as it is now", event.id, rv, server, ref.kind,
                    f"{ref.namespace}/{ref.name}" if ref.namespace else ref.name,
                    extra={"fields": {"id": event.id, "resourceVersion": rv}})
        return current, not items

    def _alive(self, event: Event, informer: Any, rv: str) -> bool:
        """A delete of an object the cache holds with that uid at the event's version or a
        later one: no deletion looks like that (a deletion is a newer version). If the API
        server has it too, the event is stale or forged: said, and not waited for (it would
        wait ``cache_wait`` for a deletion that never comes, then ask)."""
        ref = event.ref
        assert ref is not None
        held = informer.store.get(ref.namespace, ref.name) if informer.store else None
        meta = (held or {}).get("metadata") or {}
        held_rv, wanted = rv_int(str(meta.get("resourceVersion") or "")), rv_int(rv)
        if held is None or ref.uid is None or meta.get("uid") != ref.uid \
                or held_rv is None or wanted is None or held_rv < wanted \
                or not self.exists(ref):
            return False
        log.warning("event %s deletes %s %s at resourceVersion %s, but the API server has it "
                    "(same uid, resourceVersion %s): a stale or forged event; run on the "
                    "object as it is", event.id, ref.kind,
                    f"{ref.namespace}/{ref.name}" if ref.namespace else ref.name, rv, held_rv,
                    extra={"fields": {"id": event.id, "resourceVersion": rv}})
        return True

    def exists(self, ref: Any) -> bool:
        """A delete the cache never sees: does the object (that uid) still exist? Then the
        event was stale or forged, and the cache that holds the object is right. (A list by
        name: the router may list every kind it caches, it need not get them.)"""
        found = self.read_meta(ref.api_version, ref.kind, ref.namespace, ref.name)
        return found is not None and (ref.uid is None or found.get("uid") == ref.uid)

    def read_meta(self, api_version: str, kind: str, namespace: str | None,
                   name: str) -> Obj | None:
        """An object's metadata, from the API server (a list by name: the router may list
        every kind it caches, it need not get them)."""
        items = self._by_name(api_version, kind, namespace, name)["items"]
        return items[0].get("metadata") or {} if items else None

    def _by_name(self, api_version: str, kind: str, namespace: str | None, name: str) -> Obj:
        """A list of the one object of that name (metadata only): its item, if any, and the
        API server's current resourceVersion."""
        res = self.kube.resource(api_version, kind)
        return dict(next(self.kube.pages(res, namespace, limit=1, metadata_only=True,
                                         field_selector=name_selector(name))))
