"""Converge one RegistryMirror: validate, claim its hostPort, apply its objects, report.

Level-triggered: every entry point re-reads the mirror from the API server and derives
everything from the cluster as it is now, so a repeated, late or forged event costs one more
(no-op) reconcile. Writes are server-side applies (a no-op apply changes nothing on the
server), a status patch only when the status really changes, and a Warning Event only when
a problem is new, so reconciling a converged mirror writes nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from eventop.handlers.mirrors import build
from eventop.handlers.mirrors.build import API_VERSION, KIND, MirrorSpec, Names, SpecError
from eventop.kube import Forbidden, Invalid, Kube, is_owned_by, now_rfc3339, set_condition
from eventop.kube.objects import MANAGED_BY, MANAGED_BY_LABEL, get_condition

log = logging.getLogger("eventop.handlers.mirrors")

Obj = dict[str, Any]

READY = "Ready"
DEGRADED = "Degraded"
HOST_PORT_CONFLICT = "HostPortConflict"


@dataclass(frozen=True)
class Problem:
    """Why a mirror is Degraded. ``reason`` is the condition reason (CamelCase)."""

    reason: str
    message: str


# -- pure status computation ---------------------------------------------------------


def ready_condition(names: Names, sts: Obj | None, ds: Obj | None,
                    degraded: Obj | None) -> tuple[bool, str, str]:
    """(status, reason, message) of ``Ready`` from the workloads' own status.

    Ready means a pull from ``localhost:<hostPort>`` works on every node: the registry has
    a ready replica and the node proxy is ready on every node it is scheduled to. A
    DaemonSet scheduled nowhere (no schedulable node, or its status not computed yet)
    serves nothing, so that is not Ready either.
    """
    if sts is None or ds is None:
        missing = ", ".join(
            f"{kind} {name}" for kind, name, obj in (
                ("StatefulSet", names.statefulset, sts), ("DaemonSet", names.daemonset, ds))
            if obj is None)
        if degraded and degraded.get("status") == "True":
            return False, str(degraded.get("reason")), f"not created ({missing} missing): " + \
                str(degraded.get("message"))
        return False, "NotCreated", f"{missing} not created yet"
    sts_status = sts.get("status") or {}
    ready_replicas = int(sts_status.get("readyReplicas") or 0)
    if ready_replicas < 1:
        return False, "RegistryNotReady", \
            f"StatefulSet {names.statefulset} has no ready registry pod yet"
    ds_status = ds.get("status") or {}
    port = _ds_host_port(ds)
    if "observedGeneration" not in ds_status:
        return False, "NodeProxyPending", \
            f"DaemonSet {names.daemonset} has not been scheduled by its controller yet"
    desired = int(ds_status.get("desiredNumberScheduled") or 0)
    ready = int(ds_status.get("numberReady") or 0)
    if desired == 0:
        return False, "NoNodes", (f"DaemonSet {names.daemonset} runs on no node, so "
                                  f"localhost:{port} is served nowhere")
    if ready < desired:
        return False, "NodeProxyNotReady", \
            f"node proxy ready on {ready} of {desired} nodes"
    return True, "Available", \
        f"registry ready; served at localhost:{port} on {desired} node(s)"


def _ds_host_port(ds: Obj) -> int | None:
    for container in ds.get("spec", {}).get("template", {}).get("spec", {}).get(
            "containers") or []:
        for port in container.get("ports") or []:
            if port.get("hostPort"):
                return int(port["hostPort"])
    return None


def compute_status(mirror: Obj, sts: Obj | None, ds: Obj | None, *,
                   problems: list[Problem] | None, now: str) -> Obj:
    """The mirror's new status.

    ``problems`` is the outcome of a full reconcile (empty: all good); None means "status
    refresh only" (a workload changed): ``Degraded`` and ``observedGeneration`` stay as
    the last full reconcile left them.
    """
    old: Obj = mirror.get("status") or {}
    names = Names.of(mirror["metadata"]["name"])
    generation = mirror["metadata"].get("generation")
    conditions = [dict(c) for c in old.get("conditions") or []]
    observed = old.get("observedGeneration")
    if problems is not None:
        observed = generation
        if problems:
            conditions = set_condition(
                conditions, DEGRADED, True, problems[0].reason,
                "; ".join(p.message for p in problems), now, generation)
        else:
            conditions = set_condition(conditions, DEGRADED, False, "Reconciled",
                                       "all objects applied", now, generation)
    degraded = get_condition({"conditions": conditions}, DEGRADED)
    ok, reason, message = ready_condition(names, sts, ds, degraded)
    conditions = set_condition(conditions, READY, ok, reason, message, now, observed)
    port = _ds_host_port(ds) if ds is not None else None
    return {
        "observedGeneration": observed,
        "endpoint": f"localhost:{port}" if port else None,
        "serviceURL": build.service_url(mirror) if sts is not None else None,
        "conditions": conditions,
    }


# -- API-facing steps ---------------------------------------------------------------


def _owned(obj: Obj | None, mirror: Obj) -> Obj | None:
    """The object if this very mirror (by uid) owns it, else None (not ours to report)."""
    if obj is None or not is_owned_by(obj, mirror["metadata"]["uid"]):
        return None
    return obj


def _workloads(kube: Kube, mirror: Obj) -> tuple[Obj | None, Obj | None]:
    names = Names.of(mirror["metadata"]["name"])
    ns = mirror["metadata"]["namespace"]
    sts = _owned(kube.get_or_none("apps/v1", "StatefulSet", names.statefulset, ns), mirror)
    ds = _owned(kube.get_or_none("apps/v1", "DaemonSet", names.daemonset, ns), mirror)
    return sts, ds


def _write_status(kube: Kube, mirror: Obj, status: Obj) -> bool:
    if not kube.patch_status_if_changed(mirror, status):
        return False  # unchanged, or deleted meanwhile: nothing left to report on
    _report_transition(kube, mirror, mirror.get("status") or {}, status)
    return True


def _report_transition(kube: Kube, mirror: Obj, old: Obj, new: Obj) -> None:
    """A Warning Event when a problem appears or changes; a Normal one when it clears.

    Only on transitions, so a mirror stuck on a problem does not bump an Event per event.
    """
    before = get_condition(old, DEGRADED) or {}
    after = get_condition(new, DEGRADED) or {}
    if after.get("status") == "True" and (
            before.get("status") != "True" or before.get("reason") != after.get("reason")
            or before.get("message") != after.get("message")):
        kube.post_event(mirror, "Warning", str(after.get("reason")), str(after.get("message")))
    elif after.get("status") == "False" and before.get("status") == "True":
        kube.post_event(mirror, "Normal", "Recovered",
                        f"{before.get('reason')} resolved; all objects applied")


def _claim_key(mirror: Obj) -> tuple[str, str, str]:
    meta = mirror["metadata"]
    return (str(meta.get("creationTimestamp") or ""), str(meta.get("namespace") or ""),
            str(meta.get("name")))


def host_port_of(mirror: Obj) -> Any:
    return (mirror.get("spec") or {}).get("hostPort", build.DEFAULT_HOST_PORT)


def host_port_conflict(mirror: Obj, port: int, mirrors: list[Obj]) -> Problem | None:
    """The earliest mirror (creationTimestamp, then namespace/name) keeps a hostPort; any
    later one claiming it is in conflict. Mirrors being deleted no longer hold a port."""
    mine = _claim_key(mirror)
    uid = mirror["metadata"].get("uid")
    holders = sorted(
        (m for m in mirrors
         if m["metadata"].get("uid") != uid and not m["metadata"].get("deletionTimestamp")
         and host_port_of(m) == port and _claim_key(m) < mine),
        key=_claim_key)
    if not holders:
        return None
    first = holders[0]["metadata"]
    return Problem(HOST_PORT_CONFLICT,
                   f"hostPort {port} is already used by RegistryMirror "
                   f"{first.get('namespace')}/{first.get('name')}, created earlier; "
                   "choose another spec.hostPort (nothing was created for this mirror)")


def check_credentials(kube: Kube, mirror: Obj, spec: MirrorSpec) -> tuple[Problem | None,
                                                                          str | None]:
    """(problem, the Secret's resourceVersion). The Secret's data is never read into memory
    beyond checking that the two keys exist: the registry gets it via secretKeyRef."""
    if not spec.credentials_secret:
        return None, None
    ns = mirror["metadata"]["namespace"]
    secret = kube.get_or_none("v1", "Secret", spec.credentials_secret, ns)
    if secret is None:
        return Problem("CredentialsSecretMissing",
                       f"Secret {ns}/{spec.credentials_secret} named in "
                       "spec.credentialsSecretRef does not exist; create it with keys "
                       "username and password"), None
    keys = set(secret.get("data") or {}) | set(secret.get("stringData") or {})
    missing = [k for k in ("username", "password") if k not in keys]
    if missing:
        return Problem("CredentialsSecretIncomplete",
                       f"Secret {ns}/{spec.credentials_secret} lacks key(s) "
                       f"{', '.join(missing)}; the registry needs username and password"), None
    return None, str(secret["metadata"].get("resourceVersion") or "")


def plan_pvc(existing: Obj | None, spec: MirrorSpec) -> tuple[str, str | None, list[Problem],
                                                              bool]:
    """(size to apply, storage class to apply, problems, whether this asks for a resize).

    A claim never shrinks (the API server forbids it) and its storage class is immutable:
    both keep their current value and the mirror says so, instead of a failing apply.
    """
    if existing is None:
        return spec.size, spec.storage_class, [], False
    name = existing["metadata"]["name"]
    current = str(((existing.get("spec") or {}).get("resources") or {}).get(
        "requests", {}).get("storage") or spec.size)
    current_class = (existing.get("spec") or {}).get("storageClassName")
    problems: list[Problem] = []
    size, resize = spec.size, False
    wanted, have = build.parse_quantity(spec.size), build.parse_quantity(current)
    if wanted < have:
        size = current
        problems.append(Problem(
            "ShrinkRefused",
            f"PersistentVolumeClaim {name} is {current}; Kubernetes can not shrink a volume, "
            f"so spec.storage.size {spec.size} is not applied (delete the claim to start over "
            "with a smaller cache)"))
    elif wanted > have:
        resize = True
    elif wanted == have:
        size = current  # same amount, maybe spelled differently: keep the server's spelling
    storage_class = spec.storage_class
    if spec.storage_class and current_class and spec.storage_class != current_class:
        storage_class = current_class
        problems.append(Problem(
            "StorageClassImmutable",
            f"PersistentVolumeClaim {name} uses storage class {current_class}; a claim's "
            f"class can not change, so {spec.storage_class} is not applied"))
    elif not spec.storage_class:
        storage_class = current_class  # keep what the default class filled in
    return size, storage_class, problems, resize


def foreign_objects(mirror: Obj, existing: list[Obj | None]) -> Problem | None:
    """A blocking problem if an object with one of our names exists that eventop did not
    create for this mirror: applying with ``force`` would take it over and the garbage
    collector would later delete it with the mirror (a user's PVC full of data, say).

    Objects labelled as ours for a mirror of this name but owned by an earlier incarnation
    (deleted and re-created before the garbage collector ran) are taken over.
    """
    instance = build.label_value(mirror["metadata"]["name"])
    foreign = []
    for obj in existing:
        if obj is None or is_owned_by(obj, mirror["metadata"]["uid"]):
            continue
        labels = (obj.get("metadata") or {}).get("labels") or {}
        if (labels.get(MANAGED_BY_LABEL) == MANAGED_BY
                and labels.get("app.kubernetes.io/instance") == instance):
            continue
        foreign.append(f"{obj.get('kind')} {obj['metadata']['name']}")
    if not foreign:
        return None
    return Problem("NameConflict",
                   f"{', '.join(foreign)} already exist(s) and were not created by eventop for "
                   "this mirror; rename or remove them (nothing was changed)")


def apply_objects(kube: Kube, mirror: Obj, spec: MirrorSpec, *, pvc_size: str,
                  storage_class: str | None, resize: bool,
                  credentials_version: str | None) -> tuple[list[Problem], dict[str, Obj]]:
    """Server-side apply every object; a refused object is a problem, not the end.

    Returns the problems and the applied objects by kind. A refused resize is retried at
    the current size so the claim's other fields still converge. ``Unavailable``
    propagates: the event is then redelivered.
    """
    problems: list[Problem] = []
    applied: dict[str, Obj] = {}
    objects = build.desired_objects(mirror, spec, pvc_size=pvc_size,
                                    storage_class=storage_class,
                                    credentials_version=credentials_version)
    for obj in objects:
        kind, name = obj["kind"], obj["metadata"]["name"]
        try:
            applied[kind] = kube.apply(obj)
        except (Invalid, Forbidden) as exc:
            if kind == "PersistentVolumeClaim" and resize:
                problems.append(Problem(
                    "ResizeRefused",
                    f"the API server refused to resize PersistentVolumeClaim {name} to "
                    f"{spec.size} ({exc.status} {exc.reason}): {_first_line(exc.message)}"))
                log.info("resize of %s refused: %s", name, exc)
            else:
                problems.append(Problem(
                    "ApplyFailed", f"{kind} {name} was refused ({exc.status} {exc.reason}): "
                                   f"{_first_line(exc.message)}"))
                log.warning("apply of %s %s refused: %s", kind, name, exc)
    return problems, applied


def _first_line(message: str) -> str:
    """The server's message without the Go struct diff some validation errors append."""
    lines = message.strip().splitlines()
    return lines[0] if lines else message


def _existing(kube: Kube, mirror: Obj) -> dict[str, Obj | None]:
    names = Names.of(mirror["metadata"]["name"])
    ns = mirror["metadata"]["namespace"]
    return {
        "pvc": kube.get_or_none("v1", "PersistentVolumeClaim", names.pvc, ns),
        "headless": kube.get_or_none("v1", "Service", names.headless_service, ns),
        "service": kube.get_or_none("v1", "Service", names.service, ns),
        "sts": kube.get_or_none("apps/v1", "StatefulSet", names.statefulset, ns),
        "ds": kube.get_or_none("apps/v1", "DaemonSet", names.daemonset, ns),
    }


def reconcile(kube: Kube, namespace: str, name: str, *,
              mirrors: list[Obj] | None = None) -> str:
    """Converge one mirror. ``mirrors`` (every RegistryMirror in the cluster) may be passed
    in when the caller has just listed them."""
    mirror = kube.get_or_none(API_VERSION, KIND, name, namespace)
    if mirror is None:
        return f"RegistryMirror {namespace}/{name} is gone; its objects go with it (GC)"
    if mirror["metadata"].get("deletionTimestamp"):
        return f"RegistryMirror {namespace}/{name} is being deleted"
    try:
        spec = build.parse_spec(mirror)
    except SpecError as exc:
        return _finish(kube, mirror, [Problem(exc.reason, exc.message)])
    if mirrors is None:
        mirrors = kube.list(API_VERSION, KIND)
    conflict = host_port_conflict(mirror, spec.host_port, mirrors)
    if conflict:
        return _finish(kube, mirror, [conflict])
    cred_problem, cred_version = check_credentials(kube, mirror, spec)
    if cred_problem:
        return _finish(kube, mirror, [cred_problem])
    existing = _existing(kube, mirror)
    foreign = foreign_objects(mirror, list(existing.values()))
    if foreign:
        return _finish(kube, mirror, [foreign])
    size, storage_class, problems, resize = plan_pvc(existing["pvc"], spec)
    apply_problems, applied = apply_objects(
        kube, mirror, spec, pvc_size=size, storage_class=storage_class, resize=resize,
        credentials_version=cred_version)
    problems += apply_problems
    old_pvc = existing["pvc"]
    if old_pvc is not None and any(p.reason == "ResizeRefused" for p in problems):
        current = str(old_pvc["spec"]["resources"]["requests"]["storage"])
        try:
            kube.apply(build.pvc(mirror, spec, size=current, storage_class=storage_class))
        except (Invalid, Forbidden) as exc:
            log.warning("apply of %s at its current size refused too: %s",
                        old_pvc["metadata"]["name"], exc)
    sts = applied.get("StatefulSet") or _owned(existing["sts"], mirror)
    ds = applied.get("DaemonSet") or _owned(existing["ds"], mirror)
    return _finish(kube, mirror, problems, workloads=(sts, ds))


def _finish(kube: Kube, mirror: Obj, problems: list[Problem], *,
            workloads: tuple[Obj | None, Obj | None] | None = None) -> str:
    sts, ds = workloads if workloads is not None else _workloads(kube, mirror)
    status = compute_status(mirror, sts, ds, problems=problems, now=now_rfc3339())
    written = _write_status(kube, mirror, status)
    meta = mirror["metadata"]
    summary = problems[0].reason if problems else "applied"
    return f"RegistryMirror {meta['namespace']}/{meta['name']}: {summary}" + (
        "; status updated" if written else "")


def refresh_status(kube: Kube, namespace: str, name: str) -> str:
    """Recompute Ready/endpoint from the workloads only (a StatefulSet/DaemonSet changed)."""
    mirror = kube.get_or_none(API_VERSION, KIND, name, namespace)
    if mirror is None or mirror["metadata"].get("deletionTimestamp"):
        return f"RegistryMirror {namespace}/{name} is gone or going; no status to refresh"
    sts, ds = _workloads(kube, mirror)
    status = compute_status(mirror, sts, ds, problems=None, now=now_rfc3339())
    written = _write_status(kube, mirror, status)
    return f"RegistryMirror {namespace}/{name}: status " + ("updated" if written else "unchanged")


def reconcile_conflicted(kube: Kube, mirrors: list[Obj], *, skip_uid: str | None) -> list[str]:
    """Reconcile every mirror currently held back by a HostPortConflict: a change of
    another mirror (deleted, or moved to another port) may have freed its port, and no
    event of its own would tell it. ``mirrors`` is a fresh list of every mirror: the claims
    it holds (spec, creation, deletion) are not changed by reconciling, so it serves all."""
    results = []
    for m in mirrors:
        meta = m.get("metadata") or {}
        cond = get_condition(m.get("status"), DEGRADED) or {}
        if meta.get("uid") == skip_uid or cond.get("reason") != HOST_PORT_CONFLICT:
            continue
        if cond.get("status") != "True":
            continue
        results.append(reconcile(kube, meta["namespace"], meta["name"], mirrors=mirrors))
    return results
