"""The one place eventop talks to the Kubernetes API.

Every request goes through the official client's ``ApiClient`` (its configuration, auth,
TLS and urllib3 pool), addressed by URL path so that one small class serves every kind,
built-in or custom, without the generated per-kind API classes. Handlers get a :class:`Kube`
and never see HTTP.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import urllib3
from kubernetes import client as k8s_client

from eventop.kube import errors
from eventop.kube.connection import api_client, configuration
from eventop.kube.managed_fields import upgrade_patch
from eventop.kube.metrics import KUBE_REQUESTS, resource_label
from eventop.kube.objects import kube_event, now_rfc3339, status_changed
from eventop.kube.recent import Recent
from eventop.kube.resources import Resource, ResourceTable, is_custom

log = logging.getLogger("eventop.kube")

FIELD_MANAGER = "eventop"
JSON = "application/json"
#: Metadata-only reads (PartialObjectMetadata), with plain JSON as the fallback a server
#: without them answers (content negotiation).
LIST_METADATA = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
WATCH_METADATA = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
DEFAULT_TIMEOUT = (5.0, 30.0)  # connect, read (seconds)
EVENT_CACHE = 4096  # Events whose count this process knows (client-go's recorder: 4096)
EVENT_TRIES = 5  # an Event's post or count, raced by another replica's

Obj = dict[str, Any]


class Kube:
    """Get, list, apply, delete, patch status and post Events, for any kind.

    Writes use server-side apply with field manager ``eventop`` (``force=True``: the
    operator owns the fields it sets; objects it must not touch are checked by the
    handler before applying, never overwritten by accident). An apply never fails because
    the object exists: where a handler must not write into an object someone else created
    after its read, it creates with :meth:`create` (409 if the name is taken) instead.
    """

    def __init__(self, api_client: k8s_client.ApiClient, *,
                 field_manager: str = FIELD_MANAGER,
                 timeout: tuple[float, float] = DEFAULT_TIMEOUT) -> None:
        self.api = api_client
        self.field_manager = field_manager
        self.timeout = timeout
        self.resources = ResourceTable()
        self._siblings: dict[str, Kube] = {field_manager: self}
        #: The count and resourceVersion of each Event this process posted (client-go's
        #: event cache): a repeat is one PATCH, not a create refused 409, a read, a patch.
        self._event_counts: Recent[tuple[str, str], tuple[int, str]] = Recent(EVENT_CACHE)
        #: When the API server last answered, and last failed to (monotonic; shared by the
        #: siblings: one API server).
        self._answered = [-float("inf"), -float("inf")]

    # -- construction --------------------------------------------------------------

    @classmethod
    def connect(cls, kubeconfig: str | None = None, context: str | None = None,
                url: str | None = None) -> Kube:
        """Connect the way kubectl would: an explicit URL, a kubeconfig, or in-cluster.

        ``url`` (or ``EVENTOP_KUBE_URL``) is a plain HTTP API server without auth, such as
        the local API server of ``make demo`` and the tests.
        """
        return cls(api_client(configuration(kubeconfig, context, url)))

    def for_manager(self, field_manager: str) -> Kube:
        """This client writing as ``field_manager``: one per handler, so that two handlers
        setting the same field conflict visibly instead of taking it from each other.
        Shares the connection pool and the table of kinds."""
        sibling = self._siblings.get(field_manager)
        if sibling is None:
            sibling = Kube(self.api, field_manager=field_manager, timeout=self.timeout)
            sibling.resources = self.resources
            sibling._siblings = self._siblings
            sibling._event_counts = self._event_counts
            sibling._answered = self._answered
            self._siblings[field_manager] = sibling
        return sibling

    @property
    def host(self) -> str:
        return str(self.api.configuration.host)

    # -- raw HTTP ------------------------------------------------------------------

    def request(self, method: str, path: str, *, verb: str,
                query: list[tuple[str, Any]] | None = None, body: Any = None,
                content_type: str | None = None, accept: str = "application/json",
                timeout: Any = None, stream: bool = False) -> Any:
        """One API call. Returns the parsed JSON body, or the open urllib3 response if ``stream``.

        Raises a :mod:`eventop.kube.errors` exception for any non-2xx answer or transport failure.
        """
        headers = {"Accept": accept}
        if content_type:
            headers["Content-Type"] = content_type
        elif body is not None:
            headers["Content-Type"] = "application/json"
        m, url, hdrs, b, post = self.api.param_serialize(
            method, path, query_params=query or [], header_params=headers, body=body,
            auth_settings=["BearerToken"])
        try:
            resp = self.api.call_api(m, url, hdrs, b, post,
                                     _request_timeout=timeout or self.timeout)
        except (urllib3.exceptions.HTTPError, OSError, k8s_client.ApiException) as exc:
            self._answered[1] = time.monotonic()
            KUBE_REQUESTS.labels(verb, resource_label(path), "error", self.field_manager).inc()
            raise errors.Unreachable(f"{verb} {path}: Kubernetes API unreachable at "
                                     f"{self.host}: {errors.transport_reason(exc)}") from exc
        KUBE_REQUESTS.labels(verb, resource_label(path), str(resp.status),
                             self.field_manager).inc()
        self._answered[resp.status >= 500] = time.monotonic()
        if stream and 200 <= resp.status < 300:
            return resp.response
        # The body is read only now (the client does not preload it): a connection cut or
        # a read timeout after the headers is the same passing fault as one before them.
        try:
            data = resp.read()
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise errors.Unreachable(f"{verb} {path}: the answer from {self.host} broke off "
                                     f"(HTTP {resp.status}): {errors.transport_reason(exc)}"
                                     ) from exc
        if not 200 <= resp.status < 300:
            exc = errors.from_response(resp.status, data, f"{verb} {path}")
            since = time.monotonic() - self._answered[1]
            if resp.status == 403 and since < errors.RESTART_WINDOW:
                exc.message += (f" (the API server failed or was unreachable {since:.0f}s "
                                f"ago: {errors.RESTARTED})")
            raise exc
        try:
            return json.loads(data) if data else {}
        except ValueError as exc:
            raise errors.Unavailable(f"{verb} {path}: the answer from {self.host} is not "
                                     f"JSON ({len(data)} bytes): {exc}") from exc

    # -- resource resolution ---------------------------------------------------------

    def discover(self, api_version: str, *, timeout: Any = None) -> list[Resource]:
        """Every resource the API server serves in ``api_version`` (one discovery request,
        which any authenticated client may make), added to :attr:`resources`; empty if it
        serves no such group/version (a CRD not installed)."""
        group, _, version = api_version.rpartition("/")
        path = f"/apis/{api_version}" if group else f"/api/{version}"
        try:
            doc = self.request("GET", path, verb="discovery", timeout=timeout)
        except errors.NotFound:
            return []
        found = [Resource(group, version, str(item["kind"]), str(item["name"]),
                          bool(item.get("namespaced")))
                 for item in doc.get("resources") or [] if "/" not in str(item.get("name"))]
        for res in found:
            self.resources.add(res)
        return found

    def served(self, api_version: str, name: str) -> Resource:
        """The resource of a kind or plural as the API server serves it *now*: always asked
        (discovery), never the static table, which knows kinds an API server may not serve
        (an add-on's CRD, one deleted meanwhile). NotFound if it is not served."""
        return self._find(api_version, name, None, lambda r: name in (r.kind, r.plural))

    def resource(self, api_version: str, kind: str) -> Resource:
        """The resource of a kind; kinds outside the static table are found once by
        :meth:`discover`."""
        return self._find(api_version, kind, self.resources.by_kind(api_version, kind),
                          lambda r: r.kind == kind)

    def resource_by_plural(self, api_version: str, plural: str) -> Resource:
        """The resource named ``plural`` in ``api_version`` (how watch specs name them)."""
        group, _, version = api_version.rpartition("/")
        known = self.resources.by_plural(group, plural)
        return self._find(api_version, plural,
                          known if known is not None and known.version == version else None,
                          lambda r: r.plural == plural)

    def _find(self, api_version: str, what: str, known: Resource | None,
              wanted: Callable[[Resource], bool]) -> Resource:
        res = known or next((r for r in self.discover(api_version) if wanted(r)), None)
        if res is None:
            hint = ("is its CustomResourceDefinition installed?" if is_custom(api_version)
                    else "a built-in group: check the name and version with "
                         "`kubectl api-resources`")
            raise errors.NotFound(f"the API server does not serve {what} in {api_version} "
                                  f"({hint})", reason="NotFound")
        return res

    # -- reads -----------------------------------------------------------------------

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> Obj:
        if not name:  # the path of the collection: a List would come back as if an object
            raise errors.NotFound(f"no {kind} can have an empty name", reason="NotFound")
        res = self.resource(api_version, kind)
        obj: Obj = self.request("GET", res.path(namespace, name), verb="get")
        return obj

    def get_or_none(self, api_version: str, kind: str, name: str,
                    namespace: str | None = None) -> Obj | None:
        try:
            return self.get(api_version, kind, name, namespace)
        except errors.NotFound:
            return None

    def list(self, api_version: str, kind: str, namespace: str | None = None, *,
             label_selector: str | None = None, field_selector: str | None = None) -> list[Obj]:
        """Every object of a kind (all namespaces when ``namespace`` is None), paginated."""
        res = self.resource(api_version, kind)
        while True:
            try:
                items = [item for page in self.pages(res, namespace,
                                                     label_selector=label_selector,
                                                     field_selector=field_selector)
                         for item in page["items"]]
                for item in items:
                    self.fill_kind(item, res)
                return items
            except errors.ContinueExpired:
                continue  # the snapshot expired between two pages: list anew

    def pages(self, res: Resource, namespace: str | None = None, *,
              label_selector: str | None = None, field_selector: str | None = None,
              limit: int = 500, metadata_only: bool = False,
              timeout: Any = None) -> Iterator[Obj]:
        """The pages of a LIST as the server sends them, one at a time, so 10,000 objects are
        never all in memory at once (items of built-in kinds lack apiVersion and kind: see
        :meth:`fill_kind`). The last page's ``metadata.resourceVersion`` is the list's, where
        a watch starts.

        ``metadata_only`` asks for PartialObjectMetadata. Raises
        :class:`~eventop.kube.errors.ContinueExpired` if the list's snapshot expired between
        two pages: the caller must start over (pages already seen may be stale).

        A list with a label or field selector is asked for in one page: API servers of the
        1.2x series end a paginated, filtered list early (kubernetes/kubernetes#111488).
        Measured on the real v1.24 API server: of 1,200 ConfigMaps matching a label among
        6,000, pages of 500 returned 500 and pages of 100 returned 500, each time with no
        ``continue`` left, while one page returned all 1,200. A filtered list is what a
        handler narrowed down on purpose, so one page of it is a bounded one.
        """
        cont = ""
        filtered = bool(label_selector or field_selector)
        while True:
            query: list[tuple[str, Any]] = [] if filtered else [("limit", limit)]
            if label_selector:
                query.append(("labelSelector", label_selector))
            if field_selector:
                query.append(("fieldSelector", field_selector))
            if cont:
                query.append(("continue", cont))
            try:
                page = self.request("GET", res.path(namespace), verb="list", query=query,
                                    accept=LIST_METADATA if metadata_only else JSON,
                                    timeout=timeout)
            except errors.Expired as exc:
                if cont:
                    raise errors.ContinueExpired(exc.message, status=410, reason=exc.reason,
                                                 body=exc.body) from exc
                raise
            page["items"] = page.get("items") or []
            yield page
            cont = (page.get("metadata") or {}).get("continue") or ""
            if not cont:
                return

    @staticmethod
    def fill_kind(obj: Obj, res: Resource, metadata_only: bool = False) -> None:
        """Give a listed (or PartialObjectMetadata) object its resource's apiVersion/kind."""
        if metadata_only or not obj.get("kind"):
            obj["apiVersion"] = res.api_version
            obj["kind"] = res.kind

    def iter_watch(self, res: Resource, namespace: str | None, query: list[tuple[str, Any]],
                   timeout: Any, *, metadata_only: bool = False) -> Iterator[bytes]:
        """Open a watch and yield its raw lines (the reflector parses and resumes them)."""
        resp = self.request("GET", res.path(namespace), verb="watch",
                            query=[("watch", "true"), *query], timeout=timeout, stream=True,
                            accept=WATCH_METADATA if metadata_only else JSON)
        try:
            buf = b""
            for chunk in resp.stream(65536, decode_content=True):
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        yield line
            if buf.strip():
                yield buf
        finally:
            # Close before releasing: a watch left early still has a stream in flight, and a
            # pooled connection with unread data would corrupt the next request made on it.
            resp.close()
            resp.release_conn()

    # -- writes ----------------------------------------------------------------------

    def apply(self, obj: Obj, *, force: bool = True, subresource: str | None = None) -> Obj:
        """Server-side apply ``obj`` (must carry apiVersion, kind, metadata.name).

        Without ``force``, fields another manager set are not taken: the API server answers
        409 naming them. Fields this manager itself set by :meth:`create` or :meth:`replace`
        are not another's, but the API server keeps those writes (operation Update) apart
        from its applies and reports them as conflicts too: an apply refused for those alone
        is sent again with force (see :meth:`~eventop.kube.errors.Conflict.only_with`).
        """
        res = self.resource(obj["apiVersion"], obj["kind"])
        meta = obj["metadata"]
        path = res.path(meta.get("namespace"), meta["name"], subresource)
        query: list[tuple[str, Any]] = [("fieldManager", self.field_manager)]
        if not force:
            try:
                result: Obj = self.request("PATCH", path, verb="apply", query=query, body=obj,
                                           content_type="application/apply-patch+yaml")
                return result
            except errors.Conflict as exc:
                if not exc.only_with(self.field_manager):
                    raise
        query.append(("force", "true"))
        result = self.request("PATCH", path, verb="apply", query=query, body=obj,
                              content_type="application/apply-patch+yaml")
        return result

    def upgrade_managed_fields(self, obj: Obj) -> Obj | None:
        """Hand what this manager wrote by create or update to its server-side apply entry;
        the object after that, or None if there was nothing to hand over.

        The API server keeps a manager's ordinary writes (operation ``Update``) apart from
        its applies. A field set by the POST that created an object therefore stays owned
        by that Update entry, and an apply that no longer names it never removes it: a
        Service's port changed by apply keeps its old port beside the new one (refused as
        a duplicate port name), a Deployment keeps an environment variable the handler
        dropped. client-go's ``csaupgrade`` moves such fields into the Apply entry with a
        JSON patch of ``metadata.managedFields``; this is the same patch (the Python
        client has no such helper), guarded by ``test`` operations on the entries it
        rewrites and sent again on a fresh read if they moved meanwhile.
        """
        current: Obj | None = obj
        for _attempt in range(3):
            if current is None:
                return None
            patch = upgrade_patch((current.get("metadata") or {}).get("managedFields") or [],
                                  self.field_manager)
            if patch is None:
                return None
            meta = current["metadata"]
            res = self.resource(current["apiVersion"], current["kind"])
            try:
                result: Obj = self.request(
                    "PATCH", res.path(meta.get("namespace"), meta["name"]), verb="patch",
                    body=patch, content_type="application/json-patch+json",
                    query=[("fieldManager", self.field_manager)])
                return result
            except errors.Invalid:  # an entry moved: a test failed
                current = self.get_or_none(current["apiVersion"], current["kind"],
                                           meta["name"], meta.get("namespace"))
        raise errors.Conflict(f"{current['kind'] if current else 'object'} "
                              f"{meta.get('namespace', '')}/{meta['name']} kept changing while "
                              f"its managed fields were handed to {self.field_manager}'s apply")

    def create(self, obj: Obj) -> Obj:
        res = self.resource(obj["apiVersion"], obj["kind"])
        ns = obj["metadata"].get("namespace")
        result: Obj = self.request("POST", res.path(ns), verb="create", body=obj,
                                   query=[("fieldManager", self.field_manager)])
        return result

    def replace(self, obj: Obj) -> Obj:
        """PUT ``obj``; its metadata.resourceVersion makes it fail with Conflict if stale."""
        res = self.resource(obj["apiVersion"], obj["kind"])
        meta = obj["metadata"]
        result: Obj = self.request("PUT", res.path(meta.get("namespace"), meta["name"]),
                                   verb="update", body=obj,
                                   query=[("fieldManager", self.field_manager)])
        return result

    def patch(self, api_version: str, kind: str, name: str, namespace: str | None,
              patch: Obj, *, subresource: str | None = None) -> Obj:
        """JSON merge patch (RFC 7386) of one object or of its subresource."""
        res = self.resource(api_version, kind)
        result: Obj = self.request("PATCH", res.path(namespace, name, subresource), verb="patch",
                                   body=patch, content_type="application/merge-patch+json",
                                   query=[("fieldManager", self.field_manager)])
        return result

    def patch_status(self, obj: Obj, status: Obj, *, resource_version: str | None = None
                     ) -> Obj:
        """Merge-patch ``status`` through the status subresource of ``obj``; with
        ``resource_version``, only onto that version (409 Conflict if it changed since).

        Lists (conditions) are replaced whole, so pass the complete list.
        """
        meta = obj["metadata"]
        body: Obj = {"status": status}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        return self.patch(obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace"),
                          body, subresource="status")

    def patch_status_if_changed(self, obj: Obj, status: Obj) -> bool:
        """:meth:`patch_status` unless every key of ``status`` already holds that value in
        ``obj`` (as read). True if written; False if unchanged or the object is gone.

        Every write is an event for every watcher, eventop's own included: a reconcile that
        changed nothing must write nothing, or it would trigger itself forever.
        """
        if not status_changed(obj.get("status") or {}, status):
            return False
        try:
            self.patch_status(obj, status)
        except errors.NotFound:
            meta = obj["metadata"]
            log.info("%s %s is gone; status not written", obj.get("kind"),
                     "/".join(filter(None, (meta.get("namespace"), meta["name"]))))
            return False
        return True

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None = None, *,
               uid: str | None = None, resource_version: str | None = None,
               propagation: str = "Background") -> bool:
        """Delete one object; False if it was already gone.

        ``uid`` is a precondition: the delete only removes that very object, never a
        newer one created under the same name meanwhile. ``resource_version`` too: only
        that version of it (409 Conflict if it changed since it was read).
        """
        return self.delete_answer(api_version, kind, name, namespace, uid=uid,
                                  resource_version=resource_version,
                                  propagation=propagation) is not None

    def delete_answer(self, api_version: str, kind: str, name: str,
                      namespace: str | None = None, *, uid: str | None = None,
                      resource_version: str | None = None,
                      propagation: str = "Background") -> Obj | None:
        """:meth:`delete`, returning the API server's answer (None if it was already gone):
        the object as it now is, with ``deletionTimestamp`` when finalizers (or a grace
        period) hold it, which is not gone yet; or as it was, when it went at once."""
        res = self.resource(api_version, kind)
        body: Obj = {"apiVersion": "v1", "kind": "DeleteOptions",
                     "propagationPolicy": propagation}
        preconditions = {k: v for k, v in (("uid", uid), ("resourceVersion", resource_version))
                         if v}
        if preconditions:
            body["preconditions"] = preconditions
        try:
            answer = self.request("DELETE", res.path(namespace, name), verb="delete", body=body)
        except errors.NotFound:
            return None
        return answer if isinstance(answer, dict) else {}

    # -- reporting -------------------------------------------------------------------

    def post_event(self, involved: Obj, event_type: str, reason: str, message: str, *,
                   component: str = "eventop") -> None:
        """Record a Kubernetes Event about ``involved``; repeats bump ``count``.

        Best effort, like client-go's recorder: a failure to record is logged, never
        raised, so reporting can not break a reconcile. As client-go's, a repeat of an
        Event this process posted is one PATCH of its count (on the version it wrote: a
        count another replica made meanwhile is a 409, then a read, not a lost increment);
        one posted before this process, or expired, costs a create, and a read and a
        patch when the create finds it there.
        """
        event = kube_event(involved, event_type, reason, message, now_rfc3339(),
                           component=component,
                           instance=os.environ.get("HOSTNAME", component))
        meta, name, ns = involved.get("metadata") or {}, event["metadata"]["name"], \
            event["metadata"]["namespace"]
        try:
            known = self._event_counts.get((ns, name))
            stored = None
            if known is not None:
                count, version = known
                # (a 409: counted by someone else meanwhile; a 404: expired, an hour)
                with contextlib.suppress(errors.Conflict, errors.NotFound):
                    stored = self.patch("v1", "Event", name, ns, {
                        "metadata": {"resourceVersion": version},
                        "count": count + 1, "lastTimestamp": event["lastTimestamp"]})
            stored = stored or self._post_or_count(event, name, ns)
            self._event_counts.put((ns, name), (int(stored.get("count") or 1), str(
                (stored.get("metadata") or {}).get("resourceVersion"))))
        except errors.KubeError as exc:
            # An Event about an object in a namespace being deleted can not be recorded, and
            # nobody would read it: a Normal one is not worth a warning per object (a trial's
            # namespace of mirrors logged eight). A Warning one is what the user must learn
            # (a Database's NamespaceDeleted says where its data was kept): the log is the
            # only place left for it.
            terminating = exc.status == 403 and "being terminated" in str(exc.message)
            if terminating and event_type == "Warning":
                log.warning("%s %s/%s: %s (its namespace is being deleted, so this Warning "
                            "Event can not be recorded there)", reason, ns, meta.get("name"),
                            message)
                return
            log.log(logging.DEBUG if terminating else logging.WARNING,
                    "could not record Event %s/%s (%s): %s", reason, meta.get("name"),
                    message, exc)

    def _post_or_count(self, event: Obj, name: str, ns: str) -> Obj:
        """Create the Event, or bump the count of the one of its name; what is stored."""
        for attempt in range(EVENT_TRIES):
            try:
                return self.create(event)
            except errors.Conflict:  # posted before (its name is derived from it)
                pass
            # Count it, on the version read: another replica counting the same repeat
            # meanwhile is a 409 and a fresh read, not a lost increment.
            existing = self.get_or_none("v1", "Event", name, ns)
            if existing is None:
                continue  # expired between the two requests: post it anew
            try:
                return self.patch("v1", "Event", name, ns, {
                    "metadata": {"resourceVersion":
                                 existing["metadata"].get("resourceVersion")},
                    "count": int(existing.get("count") or 1) + 1,
                    "lastTimestamp": event["lastTimestamp"]})
            except (errors.Conflict, errors.NotFound):
                if attempt == EVENT_TRIES - 1:
                    raise
        raise errors.Conflict(f"Event {ns}/{name} kept being posted and expiring")

    # -- health ----------------------------------------------------------------------

    def missing_kinds(self, kinds: Iterable[tuple[str, str]]) -> list[str]:
        """Which of these (apiVersion, kind) the API server does not serve (yet).

        Asks API discovery, which every authenticated client may read, so waiting for CRDs
        needs no permission on CustomResourceDefinitions themselves. Short timeouts, like
        :meth:`ping`: readiness probes wait on this.
        """
        by_version: dict[str, set[str]] = {}
        for api_version, kind in kinds:
            by_version.setdefault(api_version, set()).add(kind)
        missing = []
        for api_version, wanted in sorted(by_version.items()):
            served = {r.kind for r in self.discover(api_version, timeout=(2.0, 3.0))}
            missing += [f"{kind}.{api_version}" for kind in sorted(wanted - served)]
        return missing

    def answered_within(self, seconds: float) -> bool:
        """Did the API server answer a request of this client (any: a watch's start, an
        error of the caller's, but not a 5xx) in the last ``seconds``, with no request
        failing since (unreachable, or a 5xx)? Readiness then needs no request of its own to
        know it is reachable."""
        answered, failed = self._answered
        return answered > failed and time.monotonic() - answered < seconds

    def ping(self) -> None:
        """Raise :class:`errors.Unavailable` unless the API server answers ``/version``."""
        self.request("GET", "/version", verb="version", timeout=(2.0, 3.0))
