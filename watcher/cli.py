"""``python -m eventop.watcher``: run, record, replay, emit.

Every flag has an environment variable (shown in ``--help``) so the same image is configured
by a Deployment's ``env``; the sink follows the SinkBinding convention, ``K_SINK``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from cloudevents.core.exceptions import CloudEventValidationError

from eventop.cli import (
    PORT,
    ConfigError,
    Parser,
    boolean,
    env_flag,
    http_url,
    integer,
    kubeconfig_files,
    log_options,
    namespace_name,
    number,
    object_name,
    report,
)
from eventop.events import simple_event, to_cloudevent
from eventop.kube import Kube, KubeError, Unavailable
from eventop.kube.leader import LeaderElector, default_identity, default_namespace
from eventop.kube.reflector import API_BACKOFF_MAX, WatchSettings
from eventop.kube.resources import is_builtin_group
from eventop.router.auth import bearer_header
from eventop.watcher.delivery import Backoff, Deliverer, Outgoing, RetryPolicy, post
from eventop.watcher.sink import SinkClient
from eventop.watcher.specs import ResourceSpec, default_resources, parse_resources
from eventop.watcher.watch import Watcher

log = logging.getLogger("eventop.watcher")
PROG = "python -m eventop.watcher"


def _add_common(p: argparse.ArgumentParser, *, sink: bool = True, kube: bool = False,
                sink_timeout: float = 30.0) -> None:
    if sink:
        env_flag(p, "--sink", "K_SINK", None, "URL the CloudEvents are posted to", http_url)
    if kube:
        env_flag(p, "--kube-url", "EVENTOP_KUBE_URL", None,
                 "plain-HTTP API server URL (e.g. the local one); otherwise kubeconfig/in-cluster",
                 http_url)
        env_flag(p, "--kubeconfig", "KUBECONFIG", None, "kubeconfig file")
        env_flag(p, "--context", "EVENTOP_KUBE_CONTEXT", None, "kubeconfig context")
    env_flag(p, "--sink-timeout", "EVENTOP_SINK_TIMEOUT_SECONDS", sink_timeout,
             "seconds to wait for the sink's answer before retrying (a hanging sink)",
             number(above=0))
    env_flag(p, "--backoff-base", "EVENTOP_BACKOFF_BASE_SECONDS", 0.5,
             "first retry delay; doubles each attempt, with jitter", number(above=0))
    env_flag(p, "--backoff-max", "EVENTOP_BACKOFF_MAX_SECONDS", 60.0, "longest retry delay",
             number(above=0))
    log_options(p)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog=PROG,
        description="Kubernetes watch events as CloudEvents (Knative ApiServerSource, "
                    "Resource mode), posted to the eventop router.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    run = sub.add_parser(
        "run", help="list+watch resources and post every change",
        description="List and watch the configured resources forever and post each change as "
                    "a CloudEvent. Resources are written [group/]version/plural[@namespace]"
                    "[:label-selector], separated by spaces. Default: every kind the handlers "
                    "listen to (the built-in ones chosen by EVENTOP_BUILTIN_HANDLERS and "
                    "yours named by EVENTOP_HANDLERS), as `python -m eventop.watcher "
                    "resources` prints them.",
        epilog="environment: EVENTOP_ROUTER_TOKEN, when set, is sent as 'Authorization: "
               "Bearer <token>' with every event (the router requires it when it has it too)")
    _add_common(run, kube=True)
    run.add_argument("--resource", action="append", default=None, metavar="RESOURCE",
                     help="a resource to watch (repeatable); replaces the default set")
    env_flag(run, "--resources", "EVENTOP_RESOURCES", None,
             "space-separated resources to watch (default: what the handlers listen to)")
    env_flag(run, "--resync-seconds", "EVENTOP_RESYNC_SECONDS", 300.0,
             "full resync period: every object is sent again as an update (0: never)",
             number(0))
    env_flag(run, "--watch-timeout", "EVENTOP_WATCH_TIMEOUT_SECONDS", 45,
             "server-side timeout of one watch request (it is then resumed); the API server "
             "sends a bookmark 2 s before it, so it bounds how long a healthy watch is silent",
             integer(1))
    env_flag(run, "--read-timeout", "EVENTOP_READ_TIMEOUT_SECONDS", 55.0,
             "a watch silent for this long (no event, no bookmark) is considered hung and "
             "resumed; keep it above --watch-timeout", number(above=0))
    env_flag(run, "--api-backoff-max", "EVENTOP_API_BACKOFF_MAX_SECONDS", API_BACKOFF_MAX,
             "longest wait between attempts to list/watch while the API server fails; short, "
             "so the watcher is back within seconds of the API server answering again",
             number(above=0))
    env_flag(run, "--page-size", "EVENTOP_PAGE_SIZE", 500, "objects per LIST page", integer(1))
    env_flag(run, "--max-in-flight", "EVENTOP_MAX_IN_FLIGHT", 32,
             "parallel deliveries (events of one object are always sent one after another); "
             "the router answers an event once its work is done, so this is how many "
             "events it may be working on at once",
             integer(1))
    env_flag(run, "--queue-size", "EVENTOP_QUEUE_SIZE", 1000,
             "events buffered before the watch stops reading (back-pressure)", integer(1))
    env_flag(run, "--max-error-attempts", "EVENTOP_MAX_ERROR_ATTEMPTS", 8,
             "attempts at an event the router answers 500 (a handler failed) before giving it "
             "up so the events queued behind it move on; the next resync sends the object "
             "again (0: forever; 503 and connection failures are always retried)", integer(0))
    env_flag(run, "--source", "EVENTOP_SOURCE", None,
             "CloudEvent source attribute (default: the API server URL)")
    env_flag(run, "--metrics-port", "EVENTOP_METRICS_PORT",
             9090 if os.environ.get("KUBERNETES_SERVICE_HOST") else 0,
             "port of the Prometheus /metrics endpoint (0: off; default 9090 in a cluster)",
             PORT)
    env_flag(run, "--drain-seconds", "EVENTOP_DRAIN_SECONDS", 20.0,
             "on SIGTERM, how long to keep delivering queued events before exiting", number(0))
    env_flag(run, "--leader-elect", "EVENTOP_LEADER_ELECT", False,
             "emit only while holding a coordination.k8s.io Lease (run several replicas, one "
             "active)", boolean, nargs="?", const=True, metavar="BOOL")
    env_flag(run, "--lease-name", "EVENTOP_LEASE_NAME", "eventop-watcher", "name of the Lease",
             object_name)
    env_flag(run, "--lease-namespace", "EVENTOP_LEASE_NAMESPACE", None,
             "namespace of the Lease (default: the pod's own namespace)", namespace_name)
    env_flag(run, "--lease-seconds", "EVENTOP_LEASE_SECONDS", 15.0,
             "how long a leader that stopped renewing keeps the lease", number(above=0))
    env_flag(run, "--renew-deadline", "EVENTOP_RENEW_DEADLINE_SECONDS", 10.0,
             "a leader unable to renew for this long stops (exits)", number(above=0))
    env_flag(run, "--retry-period", "EVENTOP_RETRY_PERIOD_SECONDS", 2.0,
             "how often the lease is renewed or tried", number(above=0))

    rec = sub.add_parser(
        "record", help="save a live LIST + watch as recorded traffic, the input of replay",
        description="LIST each resource, then watch it for --seconds, and save what the API "
                    "server sent, verbatim: per resource, <path>.list.json (the LIST response, "
                    "all pages' items in one) and <path>.watch.jsonl (one watch event per "
                    "line, BOOKMARKs included). `python -m eventop.watcher replay` and the "
                    "test kit replay such folders; tests/recordings/ in the repository holds "
                    "examples, recorded from a real API server.")
    rec.add_argument("out", type=Path, help="output directory (created)")
    rec.add_argument("--resource", action="append", required=True, metavar="RESOURCE",
                     help="[group/]version/plural[@namespace][:selector] (repeatable)")
    rec.add_argument("--seconds", type=integer(1), default=60,
                     help="how long to watch [60]")
    _add_common(rec, sink=False, kube=True)

    rep = sub.add_parser("replay", help="post a recording as the CloudEvents the live watcher "
                                        "would have sent (same ids), in order")
    rep.add_argument("paths", nargs="+", type=Path, help="recording directories or files")
    _add_sender(rep, "eventop-replay")

    res = sub.add_parser(
        "resources", help="print what `run` watches by default: every kind the handlers "
                          "listen to, one resource a line",
        description="Print the resources `run` watches when neither --resource nor "
                    "EVENTOP_RESOURCES is given: every kind the loaded handlers listen to "
                    "(EVENTOP_BUILTIN_HANDLERS, EVENTOP_HANDLERS). What the watcher's "
                    "ClusterRole must grant list and watch on.")
    _add_common(res, sink=False)

    emit = sub.add_parser("emit", help="post one CloudEvent (the CronJob's rate refresh)")
    emit.add_argument("type", help="CloudEvent type, e.g. dev.eventop.exchangerates.refresh")
    emit.add_argument("--data", default=None, help="JSON data of the event")
    emit.add_argument("--id", default=None, help="event id (default: a random UUID)")
    # The refresh handler may spend up to 40 s on a provider that is down (its budget, see
    # handlers/exchange_rates/provider.py): waiting less would post the refresh again while
    # the first still runs, and so hammer the provider with overlapping refreshes.
    _add_sender(emit, "eventop-emit", sink_timeout=60.0)
    return parser


def _add_sender(p: argparse.ArgumentParser, source: str, sink_timeout: float = 30.0) -> None:
    """The options of the one-shot senders (replay, emit): bounded retries, not forever."""
    env_flag(p, "--source", "EVENTOP_SOURCE", source, "CloudEvent source attribute")
    env_flag(p, "--max-attempts", "EVENTOP_MAX_ATTEMPTS", 8,
             "attempts per event on transient failures (0: forever)", integer(0))
    _add_common(p, sink_timeout=sink_timeout)


def _configure_logging(level: str, log_format: str) -> None:
    from eventop.router.logs import configure  # the same lines as the router

    configure(level, force=True, log_format=log_format)


def _policy(args: argparse.Namespace, max_attempts: int = 0) -> RetryPolicy:
    return RetryPolicy(Backoff(args.backoff_base, args.backoff_max),
                       (5.0, args.sink_timeout), max_attempts,
                       max_error_attempts=getattr(args, "max_error_attempts", 0))


def _need_sink(args: argparse.Namespace) -> str:
    """The sink's URL, checked as far as it can be before the first event: given, and
    reachable through the proxy the environment names for it (if any)."""
    if not args.sink:
        raise ConfigError("no sink: pass --sink URL or set K_SINK (the router's URL)")
    try:
        SinkClient(str(args.sink)).close()
        bearer_header()  # a token no HTTP header can carry would fail every post
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return str(args.sink)


def _connect(args: argparse.Namespace) -> Kube:
    """The API client; reading the configuration does no I/O, so any failure here is a
    configuration mistake."""
    if args.kubeconfig and not args.kube_url:
        kubeconfig_files(args.kubeconfig, "--kubeconfig/KUBECONFIG")
    try:
        return Kube.connect(kubeconfig=args.kubeconfig, context=args.context, url=args.kube_url)
    except Exception as exc:  # kubernetes' ConfigException, a malformed file's TypeError...
        detail = exc.message if isinstance(exc, KubeError) else f"{type(exc).__name__}: {exc}"
        raise ConfigError(f"cannot configure Kubernetes access: {detail}") from None


def _specs(args: argparse.Namespace) -> list[ResourceSpec]:
    if not args.resource and not args.resources:
        return _handlers_resources()
    try:
        return ([ResourceSpec.parse(r) for r in args.resource] if args.resource
                else parse_resources(args.resources))
    except ValueError as exc:
        raise ConfigError(f"--resource/EVENTOP_RESOURCES: {exc}") from None


def _handlers_resources() -> list[ResourceSpec]:
    """What the handlers listen to: the watcher loads them (as the router does) to know."""
    try:
        return default_resources()
    except ValueError as exc:  # HandlerLoadError: a module that does not import, a bad name
        raise ConfigError(str(exc)) from None


def check_resources(kube: Kube, specs: list[ResourceSpec]) -> None:
    """Refuse, at start, a resource that no CustomResourceDefinition can ever add, and a label
    selector the API server refuses.

    A CRD's group always contains a dot, so a resource of the core group (``v1/...``) or of
    a dotless built-in group (``apps``, ``batch``...) that the API server does not serve is a
    typo, not a CRD still to be installed: waiting for it would retry forever. A resource of
    a dotted group is left to the watch loop, which waits until its CRD is installed. A
    selector is tried with a one-item list (the API server's own parser: ``app in (a`` is a
    400 that every retry would get again). An API server that cannot be reached yet, and a
    refusal of the watcher's credentials (401, 403: a grant may come), are left to the watch
    loop too, which logs what to do and retries.

    A namespace after ``@`` that does not exist is only warned about: it may be created
    later (its objects are delivered then), but it may as well be a typo that would
    otherwise watch nothing, silently.
    """
    warn_missing_namespaces(kube, specs)
    for spec in specs:
        try:
            if is_builtin_group(spec.api_version) or spec.label_selector:
                res = spec.resource(kube)
            if spec.label_selector:
                next(kube.pages(res, spec.namespace, label_selector=spec.label_selector,
                                limit=1, metadata_only=True))
        except Unavailable:
            return
        except KubeError as exc:
            if exc.status == 400:
                raise ConfigError(f"resource {spec}: the API server refuses the label selector "
                                  f"{spec.label_selector!r}: {exc.message}") from None
            if exc.status in (401, 403):
                continue  # a grant (or a token) may come: the watch loop says what to do
            if exc.status != 404:
                raise
            if not is_builtin_group(spec.api_version):
                continue  # its CRD may come later: the watch loop waits for it
            raise ConfigError(
                f"resource {spec}: the API server does not serve {spec.plural!r} in "
                f"{spec.api_version}, and no CustomResourceDefinition can add it there; write "
                "[group/]version/plural as `kubectl api-resources` lists them, e.g. "
                "v1/configmaps or apps/v1/statefulsets") from None


def warn_missing_namespaces(kube: Kube, specs: list[ResourceSpec]) -> None:
    """Log one warning per namespace named after ``@`` that the API server does not have."""
    for namespace in sorted({s.namespace for s in specs if s.namespace}):
        try:
            found = kube.get_or_none("v1", "Namespace", namespace)
        except KubeError:
            return  # unreachable, or no grant to read namespaces: nothing to say
        if found is None:
            watched = ", ".join(str(s) for s in specs if s.namespace == namespace)
            log.warning("namespace %r does not exist: %s watch(es) nothing until it is "
                        "created (check the spelling in EVENTOP_RESOURCES or --resource)",
                        namespace, watched)


def cmd_run(args: argparse.Namespace) -> int:
    sink = _need_sink(args)
    specs = _specs(args)
    if args.leader_elect and not args.retry_period < args.renew_deadline < args.lease_seconds:
        raise ConfigError(f"leader election needs --retry-period ({args.retry_period:g}) < "
                          f"--renew-deadline ({args.renew_deadline:g}) < --lease-seconds "
                          f"({args.lease_seconds:g})")
    if args.read_timeout <= args.watch_timeout:
        raise ConfigError(f"--read-timeout ({args.read_timeout:g}, EVENTOP_READ_TIMEOUT_SECONDS)"
                          f" must be above --watch-timeout ({args.watch_timeout:g}, "
                          "EVENTOP_WATCH_TIMEOUT_SECONDS): a healthy watch that is quiet "
                          "until its timeout would be taken for a hung one")
    kube = _connect(args)
    check_resources(kube, specs)
    settings = WatchSettings(watch_timeout=args.watch_timeout, read_timeout=args.read_timeout,
                             resync_seconds=args.resync_seconds, page_size=args.page_size,
                             backoff=Backoff(args.backoff_base, args.api_backoff_max))
    deliverer = Deliverer(sink, lanes=args.max_in_flight, queue_size=args.queue_size,
                          policy=_policy(args), headers=bearer_header())
    if args.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    elector: LeaderElector | None = None
    lost = threading.Event()
    if args.leader_elect:
        elector = LeaderElector(kube, args.lease_name,
                                args.lease_namespace or default_namespace(), default_identity(),
                                lease_seconds=args.lease_seconds,
                                renew_deadline=args.renew_deadline,
                                retry_period=args.retry_period)
        if not elector.acquire(stop):
            return 0
        elector.hold(lambda: (lost.set(), stop.set()))
    watcher = Watcher(kube, specs, deliverer, settings=settings, source=args.source)
    log.info("watching %s on %s, posting to %s", " ".join(map(str, specs)), kube.host, sink,
             extra={"fields": {"resources": [str(s) for s in specs], "sink": sink}})
    watcher.start()
    stop.wait()
    if lost.is_set():
        log.error("lost the lease: stopping at once, so that only one watcher emits")
    drain = 0.0 if lost.is_set() else args.drain_seconds
    log.info("stopping: delivering queued events for up to %.0fs", drain)
    left = watcher.stop(drain)
    if elector is not None:
        elector.release()
    return 1 if lost.is_set() or left else 0


def cmd_record(args: argparse.Namespace) -> int:
    """LIST then watch each resource for ``--seconds``, saving what the server sent verbatim."""
    from eventop.watcher.record import record

    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot write the recording into {args.out}: "
                          f"{exc.strerror or exc}") from None
    kube = _connect(args)
    specs = _specs(args)
    check_resources(kube, specs)
    counts = record(kube, specs, args.out, args.seconds)
    for spec, lines in counts.items():
        print(f"{spec}: {lines} watch lines")
    return 0


def _post_all(sink: str, items: list[Outgoing], policy: RetryPolicy) -> tuple[int, int]:
    accepted = 0
    with SinkClient(sink, bearer_header()) as client:
        for item in items:
            if post(client, item, policy).ok:
                accepted += 1
    return accepted, len(items)


def cmd_replay(args: argparse.Namespace) -> int:
    from eventop.watcher.recording import load_recording, watch_files

    sink = _need_sink(args)
    try:
        if not watch_files(args.paths):
            raise ConfigError(f"no watch files (*.jsonl, as `record` writes them) in "
                              f"{' '.join(map(str, args.paths))}")
        changes = load_recording(args.paths)
    except OSError as exc:  # does not exist, not readable
        raise ConfigError(str(exc) if isinstance(exc, FileNotFoundError)
                          else f"cannot read the recording: {exc}") from None
    items = [Outgoing.of(to_cloudevent(change, obj, args.source)) for change, obj in changes]
    accepted, total = _post_all(sink, items, _policy(args, args.max_attempts))
    print(f"{accepted} of {total} events accepted by {sink}")
    return 0 if accepted == total else 1


def cmd_emit(args: argparse.Namespace) -> int:
    sink = _need_sink(args)
    try:
        data = json.loads(args.data) if args.data is not None else None
    except ValueError as exc:
        raise ConfigError(f"--data is not valid JSON: {exc}") from None
    try:
        event = simple_event(args.type, args.source, data, args.id)
    except CloudEventValidationError as exc:
        said = "; ".join(str(e) for errors in getattr(exc, "errors", {}).values()
                         for e in errors) or " ".join(str(exc).split())
        raise ConfigError(f"not a valid CloudEvent: {said}") from None
    with SinkClient(sink, bearer_header()) as client:
        result = post(client, Outgoing.of(event), _policy(args, args.max_attempts))
    if result.ok and result.status == 202 and _ignored(result.detail):
        # The router acknowledged it, but no handler wants this type: a typo in the type (a
        # CronJob that "succeeds" every hour while nothing is refreshed) is not a success.
        # (A Knative Broker answers 202 to every event it takes: that is a success.)
        print(f"event {event.get_id()} ({args.type}) accepted by {sink}, but no handler "
              f"wants type {args.type!r} (HTTP 202): check the type "
              "(dev.eventop.exchangerates.refresh refreshes the exchange rates)")
        return 1
    print(f"event {event.get_id()} ({args.type}) "
          f"{'accepted' if result.ok else 'NOT accepted'} by {sink}")
    return 0 if result.ok else 1


def _ignored(answer: str) -> bool:
    """Is this the router's answer to an event no handler wants (``outcome: ignored``)?"""
    try:
        return json.loads(answer).get("outcome") == "ignored"
    except (ValueError, AttributeError):
        return False


def cmd_resources(args: argparse.Namespace) -> int:
    for spec in _handlers_resources():
        print(f"{spec}{'  (optional)' if spec.optional else ''}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    command = {"run": cmd_run, "record": cmd_record, "replay": cmd_replay, "emit": cmd_emit,
               "resources": cmd_resources}
    args = build_parser().parse_args(argv)  # a mistake: one line, exit status 2
    try:
        if args.backoff_max < args.backoff_base:
            raise ConfigError(f"--backoff-max ({args.backoff_max:g}) is shorter than "
                              f"--backoff-base ({args.backoff_base:g})")
        _configure_logging(args.log_level, args.log_format)
        return command[args.command](args)
    except ConfigError as exc:
        return report(f"{PROG} {args.command}", exc)


if __name__ == "__main__":
    sys.exit(main())
