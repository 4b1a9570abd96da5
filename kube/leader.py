"""Leader election on a ``coordination.k8s.io/v1`` Lease: one replica of several acts.

The watcher emits only while it leads (:meth:`LeaderElector.acquire`, then :meth:`hold`, and
it exits when it loses). The router's replicas all answer events, and only the leader also
starts runs from its own watch (:meth:`LeaderElector.campaign`: a follower stays up and
stands again after a loss, since two routers acting at once cost duplicate work, not wrong
results).

The same protocol as client-go's ``leaderelection`` with a ``LeaseLock``, so ``kubectl get
lease`` reads as usual: the holder writes ``holderIdentity`` and renews ``renewTime`` every
``retry_period``; a candidate takes over once the record has not changed for
``leaseDurationSeconds`` *as observed on its own clock* (never by comparing the holder's
timestamps with its own clock: the two may be skewed). Writes use the Lease's
resourceVersion, so of two candidates racing for an expired lease exactly one wins.

A leader that cannot renew for ``renew_deadline`` (API server unreachable, lease taken) has
lost: :meth:`LeaderElector.hold` calls ``on_lost`` (the watcher exits, to be restarted as a
candidate; staying up "maybe leader" is how two replicas end up emitting). On a clean shutdown
the lease is released (holder emptied) so a standby takes over at once.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from eventop.kube import Conflict, Kube, KubeError, NotFound
from eventop.kube.errors import JUST_STARTED, RESTARTED, Forbidden, Unavailable

log = logging.getLogger("eventop.kube.leader")

LEASE = ("coordination.k8s.io/v1", "Lease")
SA_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def micro_time() -> str:
    """A Kubernetes MicroTime: RFC 3339 with microseconds."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def default_identity() -> str:
    """The pod name (HOSTNAME), the process id (several workers of one pod are candidates
    too) and a random suffix (a restarted pod is a new candidate)."""
    host = os.environ.get("HOSTNAME") or socket.gethostname()
    return f"{host}_{os.getpid()}_{uuid.uuid4().hex[:8]}"


def default_namespace() -> str:
    """The pod's own namespace (downward API or service account), else ``default``."""
    ns = os.environ.get("POD_NAMESPACE")
    if ns:
        return ns
    try:
        with open(SA_NAMESPACE, encoding="utf-8") as fh:
            return fh.read().strip() or "default"
    except OSError:
        return "default"


class LeaderElector:
    def __init__(self, kube: Kube, name: str, namespace: str, identity: str, *,
                 lease_seconds: float = 15.0, renew_deadline: float = 10.0,
                 retry_period: float = 2.0) -> None:
        if not retry_period < renew_deadline < lease_seconds:
            raise ValueError("leader election needs retry period < renew deadline < lease "
                             f"duration (got {retry_period}, {renew_deadline}, {lease_seconds})")
        self.kube = kube
        self.name, self.namespace, self.identity = name, namespace, identity
        self.lease_seconds = lease_seconds
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self._observed: tuple[str, str] | None = None  # (holder, renewTime) last seen
        self._observed_at = 0.0  # monotonic time it was first seen
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.is_leader = False
        #: The API server has let this candidate read the Lease: a 403 later is most
        #: likely an API server just restarted, not a grant missing (_what_to_check).
        self._allowed = False

    # -- one attempt ---------------------------------------------------------------

    def try_acquire_or_renew(self) -> bool:
        """One round of the protocol; True if this candidate holds the lease afterwards."""
        now = micro_time()
        lease = self.kube.get_or_none(*LEASE, self.name, self.namespace)
        self._allowed = True
        mine = {"holderIdentity": self.identity,
                "leaseDurationSeconds": max(1, round(self.lease_seconds)),
                "acquireTime": now, "renewTime": now, "leaseTransitions": 0}
        if lease is None:
            try:
                self.kube.create({"apiVersion": LEASE[0], "kind": LEASE[1],
                                  "metadata": {"name": self.name, "namespace": self.namespace},
                                  "spec": mine})
            except Conflict:
                return False  # another candidate created it first
            return True
        spec: dict[str, Any] = dict(lease.get("spec") or {})
        holder = str(spec.get("holderIdentity") or "")
        record = (holder, str(spec.get("renewTime") or ""))
        if record != self._observed:
            self._observed, self._observed_at = record, time.monotonic()
        if holder and holder != self.identity:
            duration = float(spec.get("leaseDurationSeconds") or self.lease_seconds)
            if time.monotonic() - self._observed_at < duration:
                return False  # held, and renewed recently as far as we have seen
        if holder == self.identity:
            mine["acquireTime"] = spec.get("acquireTime") or now
            mine["leaseTransitions"] = int(spec.get("leaseTransitions") or 0)
        else:
            mine["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        try:
            self.kube.replace({**lease, "spec": {**spec, **mine}})
        except Conflict:
            return False  # changed under us: someone else renewed or took it
        return True

    # -- lifecycle -------------------------------------------------------------------

    def acquire(self, stop: threading.Event) -> bool:
        """Block until this candidate leads (True) or ``stop`` is set (False)."""
        waiting_logged = False
        failed = ""  # the last failure said, so that one retried every 2 s is said once
        while not stop.is_set():
            try:
                if self.try_acquire_or_renew():
                    self.is_leader = True
                    log.info("became leader: lease %s/%s held by %s", self.namespace,
                             self.name, self.identity)
                    return True
                if not waiting_logged:
                    log.info("standing by: lease %s/%s is held by %s", self.namespace,
                             self.name, self._observed[0] if self._observed
                             else "another candidate, which took it as this one tried")
                    waiting_logged = True
                failed = ""
            except KubeError as exc:
                if str(exc) != failed:
                    hint = self._what_to_check(exc)
                    log.warning("leader election on lease %s/%s failed, retrying every "
                                "%gs: %s%s", self.namespace, self.name, self.retry_period,
                                exc, f" ({hint})" if hint else "")
                    failed = str(exc)
            stop.wait(self.retry_period)
        return False

    def _what_to_check(self, exc: KubeError) -> str:
        """The likely cause of a failure to take or renew the lease, for the log line."""
        if isinstance(exc, NotFound):
            return (f"check that the namespace {self.namespace} exists: the Lease is created "
                    "in it")
        if isinstance(exc, Unavailable):
            return "the API server is unreachable or failing; no grant is missing"
        if RESTARTED in str(exc):
            return ""  # the client's error says it already (a 403 just after a failure)
        grants = f"this service account may get, create and update leases in {self.namespace}"
        if isinstance(exc, Forbidden) and self._allowed:
            return (f"it was allowed before: the API server has most likely just restarted "
                    f"and refuses everyone until its authorization data is loaded, a few "
                    f"seconds; if this goes on, check that {grants}")
        return f"check that {grants}, {JUST_STARTED}"

    def hold(self, on_lost: Callable[[], Any]) -> None:
        """Renew in the background; ``on_lost`` once renewing failed past the deadline."""
        def renew() -> None:
            last = time.monotonic()
            while not self._stop.wait(self.retry_period):
                try:
                    if self.try_acquire_or_renew():
                        last = time.monotonic()
                        continue
                    reason = f"the lease is now held by {self._observed and self._observed[0]}"
                except KubeError as exc:
                    hint = self._what_to_check(exc)
                    reason = f"{exc} ({hint})" if hint else str(exc)
                if time.monotonic() - last >= self.renew_deadline or (
                        self._observed and self._observed[0] not in ("", self.identity)):
                    self.is_leader = False
                    log.warning("lost leadership of lease %s/%s (%s)", self.namespace,
                                self.name, reason)
                    on_lost()
                    return
                log.warning("could not renew lease %s/%s: %s", self.namespace, self.name,
                            reason)

        self._thread = threading.Thread(target=renew, name="lease-renew", daemon=True)
        self._thread.start()

    def campaign(self, stop: threading.Event,
                 on_lead: Callable[[], Any] | None = None) -> threading.Thread:
        """Lead whenever this candidate can until ``stop`` is set, then release the lease.
        :attr:`is_leader` says at any moment whether it leads; after a loss it stands again
        (for a process that does useful work as a follower too). ``on_lead`` is called each
        time it starts to lead (client-go's ``OnStartedLeading``)."""
        def loop() -> None:
            while self.acquire(stop):
                if on_lead is not None:
                    on_lead()
                lost = threading.Event()
                self.hold(lost.set)
                while not (lost.is_set() or stop.wait(self.retry_period)):
                    pass
                if stop.is_set():
                    break
            self.release()

        thread = threading.Thread(target=loop, name="lease-campaign", daemon=True)
        thread.start()
        return thread

    def release(self) -> None:
        """Stop renewing and hand the lease back, so a standby takes over without waiting."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.retry_period + 5)
        if not self.is_leader:
            return
        self.is_leader = False
        try:
            lease = self.kube.get_or_none(*LEASE, self.name, self.namespace)
            spec = dict((lease or {}).get("spec") or {})
            if lease is None or spec.get("holderIdentity") != self.identity:
                return
            spec.update(holderIdentity="", leaseDurationSeconds=1, renewTime=micro_time())
            self.kube.replace({**lease, "spec": spec})
            log.info("released lease %s/%s", self.namespace, self.name)
        except KubeError as exc:
            log.warning("could not release lease %s/%s (a standby takes over when it "
                        "expires): %s", self.namespace, self.name, exc)
