"""The Flask app: CloudEvents in, handler outcomes out.

Responses follow the Knative data-plane contract (README, "The event contract"), because the sender
(our watcher, or a Knative Broker/ApiServerSource) decides whether to retry from the
status code alone:

* ``200`` every matching handler succeeded; ``202`` no handler wants the event (it is
  acknowledged and counted, never retried: redelivering it would change nothing);
* ``400`` malformed event, ``413`` body over the limit, ``415`` not a CloudEvent content
  type: retrying cannot help, so these are final;
* ``503`` a handler could not reach the Kubernetes API (or no API is configured), ``500``
  any other handler failure: the sender retries with backoff, which is safe because
  handlers are idempotent.

A ``2xx`` answer carries a JSON body saying what each handler did, except to a Knative
Broker or Channel: they take a non-empty body that is not a CloudEvent for a failed
delivery (502, retried, then dead-lettered), so a delivery that says it is one (``Prefer:
reply``, or the Broker's ``knativearrivaltime`` extension) gets an empty body. Error
answers keep theirs: Knative retries them whatever they say.

The app object is importable as ``gunicorn 'eventop.router.app:create_app()'``;
``python -m eventop.router`` adds the multi-worker metrics setup and sensible defaults (see
:mod:`eventop.router.server`).
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Any

from flask import Flask, Request, Response, request
from werkzeug.exceptions import HTTPException, InternalServerError, RequestEntityTooLarge

from eventop.engine.catchup import CacheBehind
from eventop.handlers.events import Event, InvalidEvent
from eventop.handlers.registry import Outcome, Registry
from eventop.kube.errors import KubeError, Unavailable
from eventop.kube.resources import is_builtin_group, is_custom
from eventop.router import auth, logs, metrics
from eventop.router.dispatch import (
    EngineProvider,
    process_generation,
    run_controllers,
    validate,
)
from eventop.router.parse import BadEvent, parse_environ

if TYPE_CHECKING:
    from eventop.kube import Kube

log = logging.getLogger("eventop.router")

DEFAULT_MAX_BODY = 8 * 1024 * 1024  # Kubernetes objects reach 1.5 MiB; leave headroom
READY_CACHE_SECONDS = 2.0
#: An API answer this recent (a watch started, a write), with no failure since, makes the
#: readiness ping needless: each cache's watch starts again every 45 s, and an API server
#: that goes away breaks them at once (their next start fails, and the probe after it pings).
ANSWERED_RECENTLY_SECONDS = 60.0
#: How long "every CRD the event functions need is served" holds before it is asked again.
SERVED_RECHECK_SECONDS = 60.0


def max_body_bytes() -> int:
    """The request body limit: ``EVENTOP_MAX_BODY_BYTES`` or 8 MiB."""
    raw = os.environ.get("EVENTOP_MAX_BODY_BYTES", "").strip()
    if not raw:
        return DEFAULT_MAX_BODY
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"EVENTOP_MAX_BODY_BYTES must be a number of bytes, not {raw!r}") \
            from None
    if value <= 0:
        raise ValueError(f"EVENTOP_MAX_BODY_BYTES must be positive, not {value}")
    return value


class KubeProvider:
    """The Kubernetes access handed to handlers: given, or one per worker process.

    Created lazily on first use so that nothing connects at import time and each gunicorn
    worker builds its own connection pool *after* the fork (a urllib3 pool shared across
    a fork would interleave two processes' traffic on one socket).
    """

    def __init__(self, kube: Kube | None = None) -> None:
        self._fixed = kube
        self._kube: Kube | None = None
        self._generation: int | None = None
        self._lock = threading.Lock()

    def get(self) -> Kube:
        """The ``Kube``; raises :class:`eventop.kube.errors.Unavailable` if none can be
        configured."""
        if self._fixed is not None:
            return self._fixed
        generation = process_generation()
        if self._kube is not None and self._generation == generation:
            return self._kube
        with self._lock:
            if self._kube is None or self._generation != generation:
                from eventop.kube import Kube

                try:
                    self._kube = Kube.connect()
                except KubeError:
                    raise
                except Exception as exc:  # a broken kubeconfig, unreadable token file...
                    raise Unavailable(f"cannot configure Kubernetes access: "
                                      f"{type(exc).__name__}: {exc}") from exc
                self._generation = generation
            return self._kube


class Readiness:
    """The API server answers, and every handler that can run has its cache synced.

    A handler whose CRD is not installed (``kubectl apply -k crds/``, a separate admin step:
    the operator never creates CRDs) waits for it, named in the reason, without holding the
    other handlers back: no event of a kind that is not served can arrive anyway.
    Remembered for a couple of seconds: kubelet probes every replica every few seconds,
    caching keeps a probe from turning into API requests each time, and the lock makes
    concurrent probes share one check. Most probes make none at all: the API server is known
    to answer when it answered a request of the router's in the last
    :data:`ANSWERED_RECENTLY_SECONDS` and none failed since (its caches' watches start every
    45 s), and the CRDs, once all served, are asked about again only every
    :data:`SERVED_RECHECK_SECONDS` (a deleted one stops its controllers' caches at once; this
    is only the event functions' list). A trial counted 24 requests a minute per replica
    from probes every 5 s: more than its watches and its Lease together.
    """

    def __init__(self, provider: KubeProvider, ttl: float = READY_CACHE_SECONDS,
                 kinds: dict[tuple[str, str], list[str]] | None = None,
                 engines: EngineProvider | None = None) -> None:
        self.provider = provider
        self.kinds = kinds or {}
        self.engines = engines
        self.ttl = ttl
        self._lock = threading.Lock()
        self._at = -float("inf")
        self._result: tuple[bool, str] = (False, "not checked yet")
        self._all_served_at = -float("inf")

    def check(self) -> tuple[bool, str]:
        with self._lock:
            if time.monotonic() - self._at < self.ttl:
                return self._result
            try:
                kube = self.provider.get()
                if not kube.answered_within(ANSWERED_RECENTLY_SECONDS):
                    kube.ping()
                host = getattr(kube, "host", "")
                ok, text = True, "Kubernetes API reachable" + (f" at {host}" if host else "")
                if self.engines:
                    ok, synced = self.engines.readiness()
                    text += f"; {synced}"
                missing = []
                if self.kinds and time.monotonic() - self._all_served_at \
                        >= SERVED_RECHECK_SECONDS:
                    missing = kube.missing_kinds(set(self.kinds))
                    if not missing:
                        self._all_served_at = time.monotonic()
                if missing:
                    waiting = sorted({h for kind in missing
                                      for h in self.kinds[_kind_key(kind)]})
                    text += (f"; {', '.join(waiting)} wait(s) for the "
                             f"CustomResourceDefinitions of {', '.join(missing)}: install "
                             "them with `kubectl apply -k crds/`")
                self._result = (ok, text)
            except KubeError as exc:
                self._result = (False, str(exc))
            except Exception as exc:  # readiness must answer, whatever went wrong
                self._result = (False, f"{type(exc).__name__}: {exc}")
            self._at = time.monotonic()
            return self._result


def check_builtin_kinds(registry: Registry, kube: Kube) -> None:
    """Raise ``ValueError`` when a handler declares a kind of a dotless built-in group
    (``v1``, ``apps``, ``batch``...) that the API server does not serve.

    No CustomResourceDefinition can add a kind there, so it is a typo (``ResourceQoute``),
    and waiting for it, as for a CRD to install, would leave the router ready with a handler
    that never runs. Called once at start (:func:`eventop.router.server.check_app`), as the
    watcher checks its resources; an API server that does not answer (or refuses discovery)
    is left to readiness."""
    needed = {key: names for key, names in registry.needed_kinds().items()
              if is_builtin_group(key[0])}
    try:
        missing = kube.missing_kinds(needed)
        if not missing:
            return
        api_version, kind = _kind_key(missing[0])
        served = {r.kind for r in kube.discover(api_version, timeout=(2.0, 3.0))}
    except KubeError:
        return
    close = difflib.get_close_matches(kind, served, n=1)
    raise ValueError(
        f"{', '.join(needed[(api_version, kind)])} declare(s) {api_version}/{kind}, which the "
        "API server does not serve"
        + (f" (it serves no {api_version} at all)" if not served else "")
        + ": no CustomResourceDefinition can add a kind to a built-in group; check the "
        "spelling in owns=/reads=/@on"
        + (f" (did you mean {api_version}/{close[0]}?)" if close else ""))


def _kind_key(missing: str) -> tuple[str, str]:
    """``Kind.group/version`` (as :meth:`Kube.missing_kinds` names it) back to its key."""
    kind, _, api_version = missing.partition(".")
    return api_version, kind


_encode = json.JSONEncoder().encode


def _json(body: dict[str, Any], status: int) -> Response:
    return Response(_encode(body).encode(), status=status, content_type="application/json")


def knative_delivery(environ: dict[str, Any]) -> bool:
    """Whether a Knative Broker or Channel sent the request: they send ``Prefer: reply``
    (Eventing 1.0 on), and a Broker's events carry ``knativearrivaltime`` (binary mode, as
    its filter delivers). Such a sender reads a 2xx answer's body as the reply event."""
    prefer = environ.get("HTTP_PREFER")
    return ("HTTP_CE_KNATIVEARRIVALTIME" in environ
            or (prefer is not None and "reply" in prefer.lower()))


def _describe(event: Event) -> dict[str, Any]:
    """What the log line and the metrics say about the event: never its data."""
    ref = event.ref
    ext = event.extensions
    return {
        "id": event.id, "type": event.type, "source": event.source,
        "kind": ref.kind if ref else ext.get("kind", ""),
        "namespace": (ref.namespace if ref else ext.get("namespace")) or "",
        "name": ref.name if ref else ext.get("name", ""),
    }


def _outcome_json(outcome: Outcome) -> dict[str, Any]:
    return {"handler": outcome.handler, "outcome": "ok" if outcome.ok else "error",
            "detail": outcome.detail}


def _read_body(req: Request, limit: int) -> bytes:
    """The request body, refusing one over ``limit`` (``MAX_CONTENT_LENGTH``) even chunked.

    Werkzeug rejects a too large ``Content-Length`` up front, but a chunked body (no
    length) is only cut off at the limit: ``get_data`` returns the first bytes as if they
    were the whole body. Then one more byte from the server's stream means it was too long.
    """
    body = req.get_data(cache=False)
    if (len(body) >= limit and not req.environ.get("CONTENT_LENGTH")
            and req.environ["wsgi.input"].read(1)):
        raise RequestEntityTooLarge()
    return body


def controller_outcomes(engines: EngineProvider, event: Event) -> list[Outcome]:
    """The controllers' runs for the event; an engine that can not run them is one
    unavailable outcome (503: the sender retries)."""
    try:
        return run_controllers(engines, event)
    except Unavailable as exc:
        return [Outcome("engine", False, 0.0, str(exc), exc)]


def create_app(registry: Registry | None = None, kube: Kube | None = None, *,
               start_engine: bool = True) -> Flask:
    """The router app. ``registry`` defaults to :func:`eventop.handlers.load` (built-in
    handlers plus ``EVENTOP_HANDLERS``); ``kube`` defaults to ``Kube.connect()``, made once per
    worker process on first use (``EVENTOP_KUBE_URL``, kubeconfig or in-cluster).
    ``start_engine=False``: the engine starts with the first event or probe, not at once (an
    app built only to be checked must not take the Lease or watch anything)."""
    logs.configure()
    if registry is None:
        from eventop import handlers

        registry = handlers.load()
    app = Flask("router")
    app.config["MAX_CONTENT_LENGTH"] = limit = max_body_bytes()
    provider = KubeProvider(kube)
    engines = EngineProvider(registry, provider)
    needed = registry.needed_kinds(controllers=False)
    readiness = Readiness(provider, kinds={k: v for k, v in needed.items() if is_custom(k[0])},
                          engines=engines)
    token = auth.configured_token()
    app.extensions["eventop"] = {"registry": registry, "kube": provider,
                                 "readiness": readiness, "engine": engines}
    if engines and start_engine:
        engines.start_soon()

    def finish(status: int, outcome: str, info: dict[str, Any], start: float,
               body: dict[str, Any], handler_names: list[str] | None = None,
               level: int = logging.INFO, error: str | None = None,
               results: list[dict[str, Any]] | None = None) -> Response:
        metrics.event_counter(info["type"], info["kind"], outcome).inc()
        if log.isEnabledFor(level):  # the line's fields only for a line that is written
            duration_ms = round((time.perf_counter() - start) * 1000, 3)
            fields = {**info, "handlers": handler_names or [], "outcome": outcome,
                      "status": status, "duration_ms": duration_ms}
            if results:
                fields["results"], more = logs.folded(results, logs.FIELD_RESULTS)
                if more:
                    fields["results_left_out"] = more
            if error:
                fields["error"] = error
            logs.log_fields(log, level,
                            logs.event_message(info, status, duration_ms, results, error),
                            fields)
        if 200 <= status < 300 and knative_delivery(request.environ):
            return Response(status=status)  # no reply event: see the module docstring
        return _json(body, status)

    listened = {k.key for k in registry.watched_kinds()}
    unknown_kinds: set[tuple[str, str]] = set()

    def ignored(event: Event, info: dict[str, Any], start: float) -> Response:
        # Most of a cluster's changes concern no handler (every ConfigMap and Secret comes
        # through): counted by type and kind in eventop_events_total{outcome="ignored"}, and
        # a line only at debug, as controller-runtime logs no line for a change that maps
        # to no work. A line per event at info is for events a handler ran for.
        # A kind no loaded handler listens to at all is another matter: a Trigger or an
        # ApiServerSource sends it, and the router was meant to have a handler for it (its
        # EVENTOP_HANDLERS forgotten?): said once per kind, at warning.
        ref = event.ref
        kind = (ref.api_version, ref.kind) if ref is not None else None
        if kind is not None and kind not in listened and kind not in unknown_kinds \
                and len(unknown_kinds) < 100:
            unknown_kinds.add(kind)
            log.warning("events of %s/%s arrive, but no loaded handler listens to that "
                        "kind: they are answered 202 and dropped (is EVENTOP_HANDLERS "
                        "set where the router runs? or remove the kind from the event "
                        "source)", *kind, extra={"fields": {**info, "apiVersion": kind[0]}})
        return finish(202, "ignored", info, start, {
            "id": event.id, "outcome": "ignored", "handlers": [],
            "detail": f"no handler registered for type {event.type!r}"
                      + (f" and kind {info['kind']!r}" if info["kind"] else "")},
            level=logging.DEBUG)

    def reject(status: int, outcome: str, message: str, known: dict[str, Any],
               start: float) -> Response:
        info = {"id": str(known.get("id", "")), "type": "", "kind": ""}
        body: dict[str, Any] = {"error": message}
        if known.get("id"):
            body["id"] = known["id"]
        # The type of a rejected event is sender-controlled: keep it out of metric labels.
        return finish(status, outcome, info, start, body, level=logging.WARNING,
                      error=message)

    def unauthorized(start: float) -> Response:
        resp = reject(401, "unauthorized", "missing or wrong bearer token: this router "
                      f"requires the token of {auth.ENV} in an 'Authorization: Bearer' header",
                      {"id": request.headers.get("ce-id", "")[:200]}, start)
        resp.headers["WWW-Authenticate"] = 'Bearer realm="eventop"'
        return resp

    @app.post("/")
    @app.post("/events")
    def receive() -> Response:
        start = time.perf_counter()
        req = request._get_current_object()  # type: ignore[attr-defined]  # one proxy lookup
        if token is not None and not auth.authorized(req.environ.get("HTTP_AUTHORIZATION"),
                                                     token):
            return unauthorized(start)
        try:
            event = parse_environ(req.environ, _read_body(req, limit))
        except BadEvent as bad:
            outcome = "unsupported_media_type" if bad.status == 415 else "invalid"
            return reject(bad.status, outcome, bad.message, bad.known, start)
        except RequestEntityTooLarge:
            return reject(413, "too_large",
                          f"request body is larger than the limit of {limit} bytes "
                          f"(raise EVENTOP_MAX_BODY_BYTES if such events are legitimate)",
                          {"id": req.headers.get("ce-id", "")}, start)
        info = _describe(event)
        try:
            kube_access = provider.get()  # cheap once made: no I/O, one per worker
        except Unavailable as exc:
            names = [r.name for r in registry.matching(event)] + engines.interested(event)
            if not names:
                return ignored(event, info, start)
            return finish(503, "unavailable", info, start, {
                "id": event.id, "outcome": "unavailable", "handlers": [],
                "error": f"Kubernetes API not available, handlers {', '.join(names)} not run: "
                         f"{exc}"}, names, logging.ERROR, str(exc))
        try:
            matched = registry.matching(event)
            if matched:
                validate(engines, event)  # a 400 must have run no event function
            outcomes = registry.run(matched, event, kube_access)
            outcomes += controller_outcomes(engines, event)
        except InvalidEvent as bad:  # the sender's mistake: sending it again would not help
            return reject(400, "invalid", f"event {event.id}: {bad}", {"id": event.id}, start)
        except Exception as exc:  # the registry captures handler errors; this is a bug
            log.exception("dispatching event %s failed", event.id, extra={"fields": info})
            message = f"event {event.id}: dispatch failed: {type(exc).__name__}: {exc}"
            return finish(500, "error", info, start, {
                "id": event.id, "outcome": "error", "error": message, "handlers": []},
                None, logging.ERROR, message)
        if not outcomes:
            return ignored(event, info, start)
        for o in outcomes:
            metrics.handler_duration(o.handler).observe(o.duration)
        failed = [o for o in outcomes if not o.ok]
        results = [_outcome_json(o) for o in outcomes]
        ran = [o.handler for o in outcomes]
        if not failed:
            # A resync or redelivery of what is converged (every run wrote nothing, or the
            # event was an echo of eventop's own write) is logged at debug: a line per
            # watched object every resync period says nothing, as controller-runtime logs
            # nothing for a reconcile that changed nothing. It is counted all the same.
            quiet = all(o.quiet for o in outcomes)
            return finish(200, "ok", info, start,
                          {"id": event.id, "outcome": "ok", "handlers": results}, ran,
                          logging.DEBUG if quiet else logging.INFO, results=results)
        for o in failed:
            err = o.error
            # The API server's answer (unavailable, a refusal such as RBAC's 403) is a
            # condition, not a bug: its message says it all, and a traceback per retried
            # event would bury the log. A cache still catching up (a CRD just installed, a
            # watch resuming after a restart) is not even a failure: the resend finds it
            # caught up, so it is a warning.
            trace = err is not None and not isinstance(err, KubeError)
            log.log(logging.WARNING if isinstance(err, CacheBehind) else logging.ERROR,
                    "handler %s failed on event %s: %s", o.handler, event.id, o.detail,
                    exc_info=(type(err), err, err.__traceback__) if trace else None,
                    extra={"fields": {**info, "handler": o.handler}})
        behind = all(isinstance(o.error, CacheBehind) for o in failed)
        unavailable = all(isinstance(o.error, Unavailable) for o in failed)
        status, outcome = (503, "unavailable") if unavailable else (500, "error")
        message = (f"event {event.id}: handler(s) failed: "
                   + "; ".join(f"{o.handler}: {o.detail}" for o in failed))
        return finish(status, outcome, info, start, {
            "id": event.id, "outcome": outcome, "error": message, "handlers": results},
            ran, logging.WARNING if behind else logging.ERROR, message, results)

    @app.get("/healthz")
    def healthz() -> Response:
        """Liveness: the worker answers. Deliberately independent of the API server, so an
        API outage makes pods unready (no traffic) instead of restarting them in a loop."""
        return _json({"status": "alive"}, 200)

    @app.get("/readyz")
    def readyz() -> Response:
        ok, reason = readiness.check()
        return _json({"ready": ok, "reason": reason}, 200 if ok else 503)

    @app.get("/metrics")
    def metrics_view() -> Response:
        payload, content_type = metrics.render()
        return Response(payload, status=200, content_type=content_type)

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> Response:
        if isinstance(exc, InternalServerError) and exc.original_exception is not None:
            original = exc.original_exception
            log.error("unexpected error on %s %s", request.method, request.path,
                      exc_info=(type(original), original, original.__traceback__))
            return _json({"error": f"internal error: {type(original).__name__}: {original}"},
                         500)
        return _json({"error": f"{exc.name}: {exc.description}"}, exc.code or 500)

    return app
