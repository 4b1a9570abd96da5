"""What should exist for one RegistryMirror: a pure function of the mirror and the cache.

The engine calls :func:`desired` with the mirror and its cached reads, and writes only the
differences (creates with POST, server-side applies, status when it changed, Events with
it). The decisions, in order, each of which stops the mirror short of writing anything
(its objects stay as they were) and says why in ``Degraded``:

1. an invalid spec (:mod:`.spec` raises the engine's ``SpecError``; the engine reports it);
2. a **hostPort** another mirror holds: hostPorts are per node, so unique across every
   mirror of the cluster. A mirror *holds* a port once its objects were applied with it:
   its status records it (``status.hostPort``), and so does its own DaemonSet while it
   exists (the only record under a CRD that prunes the field). The holding survives the
   DaemonSet being deleted by hand (the mirror creates it again) and a spec change that is
   held back (its old objects still serve the old port); it ends with the mirror (deleted,
   or its namespace) or when it moves elsewhere. A mirror moving onto a held port is the
   one held back; among mirrors none of which holds the port, the earliest
   (creationTimestamp, then namespace/name) takes it. A mirror with an invalid spec takes
   no port (it runs nothing), though it keeps one it holds. A mirror held back this way is
   reconciled again when the change of another mirror may free its port (see the mapping
   in the package);
3. a missing or incomplete **credentials Secret** (its data is only checked for the two
   keys, never copied: the registry reads it through ``secretKeyRef``);
4. an object at one of the mirror's names that eventop did not create for it (a user's
   claim full of data, say): taking it over would have the garbage collector delete it
   with the mirror. Objects labelled as this mirror's but owned by an earlier mirror of
   the same name (deleted and created again before the garbage collector ran) are taken
   over (the controller's ``adopts``).

Otherwise the five objects of :mod:`.build` are wanted. A claim never shrinks and keeps its
storage class (both immutable); a bigger size is a resize, which the API server may refuse
(the claim is unbound, or its class does not expand): the refusal is the claim's failure
only, the other objects still converge, and ``Degraded=ResizeRefused`` says why.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
from collections.abc import Callable, Collection
from typing import Any

from eventop.engine import Child, Desired, Note, Outcome, Reads, SpecError
from eventop.handlers.mirrors import build
from eventop.handlers.mirrors.build import Names
from eventop.handlers.mirrors.spec import (
    API_VERSION,
    KIND,
    MirrorSpec,
    host_port_of,
    parse_quantity,
    parse_spec,
)
from eventop.handlers.mirrors.status import (
    DEGRADED,
    POD_SECURITY,
    Problem,
    compute_status,
    host_port,
    transition_notes,
)
from eventop.kube import MANAGED_BY, MANAGED_BY_LABEL, get_condition, is_owned_by, now_rfc3339

Obj = dict[str, Any]

MIRROR = f"{API_VERSION}/{KIND}"
PVC = "v1/PersistentVolumeClaim"
SERVICE = "v1/Service"
STATEFULSET = "apps/v1/StatefulSet"
DAEMONSET = "apps/v1/DaemonSet"
SECRET = "v1/Secret"
NAMESPACE = "v1/Namespace"
HOST_PORT_CONFLICT = "HostPortConflict"


# -- the decisions, one by one ---------------------------------------------------------


def _claim_key(mirror: Obj, holders: Collection[str]) -> tuple[bool, str, str, str]:
    """A mirror holding the port first, then the earliest."""
    meta = mirror["metadata"]
    return (meta.get("uid") not in holders, str(meta.get("creationTimestamp") or ""),
            str(meta.get("namespace") or ""), str(meta.get("name")))


def claims(mirror: Obj, port: int) -> bool:
    """Does the mirror's spec ask for ``port``, and is it valid? An invalid spec runs
    nothing, so it must not keep a valid mirror off the port (it may still *hold* it)."""
    if host_port_of(mirror) != port:
        return False
    try:
        parse_spec(mirror)
    except SpecError:
        return False
    return True


def host_port_conflict(mirror: Obj, port: int, mirrors: list[Obj],
                       holders: Collection[str] = ()) -> Problem | None:
    """The mirror holding a hostPort keeps it; any other claiming it is in conflict.

    ``holders`` are the uids of the mirrors holding the port (:func:`port_holders`): a
    mirror moving onto a port another mirror holds must not take it over (two DaemonSets
    on one hostPort, the one there first blamed), even while the holder's DaemonSet is
    deleted and not yet created again. Among mirrors none of which holds it (both new), the
    earliest valid claimant (creationTimestamp, then namespace/name) takes it. Mirrors being
    deleted neither hold nor claim a port.
    """
    mine = _claim_key(mirror, holders)
    uid = mirror["metadata"].get("uid")
    ahead = sorted(
        (m for m in mirrors
         if m["metadata"].get("uid") != uid and not m["metadata"].get("deletionTimestamp")
         and (m["metadata"].get("uid") in holders or claims(m, port))
         and _claim_key(m, holders) < mine),
        key=lambda m: _claim_key(m, holders))
    if not ahead:
        return None
    first = ahead[0]["metadata"]
    why = "which holds it" if first.get("uid") in holders else "created earlier"
    return Problem(HOST_PORT_CONFLICT,
                   f"hostPort {port} is already used by RegistryMirror "
                   f"{first.get('namespace')}/{first.get('name')}, {why}; "
                   "choose another spec.hostPort (this mirror's objects were neither "
                   "created nor changed)")


def orphaned_port_holders(mirror: Obj, port: int, daemonsets: list[Obj]) -> list[Obj]:
    """Node-proxy DaemonSets on ``port`` that no mirror owns (one deleted with
    ``--cascade=orphan`` leaves its DaemonSet serving): a second DaemonSet on that hostPort
    would never run a pod on any node. The one at this mirror's own name is left to
    :func:`in_the_way` (adopted, or a NameConflict)."""
    ns, own = mirror["metadata"].get("namespace"), Names.of(mirror["metadata"]["name"]).daemonset
    return [ds for ds in daemonsets
            if not ds["metadata"].get("ownerReferences") and host_port(ds) == port
            and not ds["metadata"].get("deletionTimestamp")
            and (ds["metadata"].get("namespace"), ds["metadata"]["name"]) != (ns, own)]


def orphaned_port_conflict(port: int, orphans: list[Obj]) -> Problem | None:
    if not orphans:
        return None
    ds = orphans[0]["metadata"]
    return Problem(HOST_PORT_CONFLICT,
                   f"hostPort {port} is already used by DaemonSet {ds.get('namespace')}/"
                   f"{ds['name']}, which no RegistryMirror owns (left by a mirror deleted with "
                   "--cascade=orphan?): delete it, or choose another spec.hostPort (this "
                   "mirror's objects were neither created nor changed)")


def recorded_port(mirror: Obj) -> int | None:
    """The hostPort the mirror's status says it holds (``status.hostPort``), if any."""
    port = (mirror.get("status") or {}).get("hostPort")
    return port if isinstance(port, int) and not isinstance(port, bool) else None


def port_holders(port: int, mirrors: list[Obj],
                 daemonset_of: Callable[[Obj], Obj | None]) -> set[str]:
    """The uids of the live mirrors holding ``port``: their status records it, or their own
    DaemonSet (``daemonset_of``: the one the mirror owns, or None) uses it."""
    return {m["metadata"]["uid"] for m in mirrors
            if m["metadata"].get("uid") and not m["metadata"].get("deletionTimestamp")
            and (recorded_port(m) == port
                 or ((ds := daemonset_of(m)) is not None and host_port(ds) == port))}


def held_port(mirror: Obj, spec: MirrorSpec, ds: Obj | None) -> int | None:
    """The port a held-back mirror goes on holding (its objects stay as they were): the
    one its own DaemonSet serves; with that DaemonSet gone, the recorded one if the spec
    still asks for it (the DaemonSet is created on it again once the mirror is unblocked)."""
    if ds is not None:
        return host_port(ds)
    recorded = recorded_port(mirror)
    return recorded if recorded == spec.host_port else None


def held_back_by_host_port(mirror: Obj) -> bool:
    """Does the mirror's status say another mirror holds its hostPort?"""
    cond = get_condition(mirror.get("status"), DEGRADED) or {}
    return cond.get("status") == "True" and cond.get("reason") == HOST_PORT_CONFLICT


def check_credentials(mirror: Obj, spec: MirrorSpec,
                      secret: Obj | None) -> tuple[Problem | None, str | None]:
    """(problem, :func:`credentials_digest` of the Secret) for the Secret named in
    ``credentialsSecretRef`` (``secret`` is what the cache holds at that name)."""
    if not spec.credentials_secret:
        return None, None
    ns = mirror["metadata"]["namespace"]
    if secret is None:
        return Problem("CredentialsSecretMissing",
                       f"Secret {ns}/{spec.credentials_secret} named in "
                       "spec.credentialsSecretRef does not exist; create it with keys "
                       "username and password"), None
    keys = set(secret.get("data") or {}) | set(secret.get("stringData") or {})
    missing = [k for k in build.CREDENTIAL_KEYS if k not in keys]
    if missing:
        return Problem("CredentialsSecretIncomplete",
                       f"Secret {ns}/{spec.credentials_secret} lacks key(s) "
                       f"{', '.join(missing)}; the registry needs username and password"), None
    return None, credentials_digest(secret)


def credentials_digest(secret: Obj) -> str:
    """A hash of what the registry reads from the Secret (its username and password), for
    the pod annotation that rolls the registry when they change.

    Only these values: a label, an annotation or another key of the Secret (any write that
    bumps its resourceVersion) changes nothing the registry uses, so it must not restart
    it. ``stringData`` (as written, before the API server folds it into ``data``) is
    encoded as ``data`` would hold it, so both spellings of the same credentials agree.

    Keyed with the Secret's uid (an HMAC): anyone who may read the StatefulSet or its pods
    sees the annotation, and a plain hash of a password lets them check guesses at it
    offline. The uid is in the Secret only, whose readers see the password anyway (a Secret
    made again under its name restarts the registry once).
    """
    data = secret.get("data") or {}
    plain = secret.get("stringData") or {}
    used = {k: base64.b64encode(str(plain[k]).encode()).decode() if k in plain
            else data.get(k) for k in build.CREDENTIAL_KEYS}
    key = str((secret.get("metadata") or {}).get("uid") or "").encode()
    return hmac.new(key, json.dumps(used, sort_keys=True).encode(),
                    hashlib.sha256).hexdigest()[:16]


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
    wanted, have = parse_quantity(spec.size), parse_quantity(current)
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
    if spec.storage_class and spec.storage_class != current_class:
        # A claim made without a class (none was asked for and the cluster has no default
        # one) keeps having none: the class is as immutable as any other ("" tells
        # build.pvc to write none, where None would mean the spec's).
        storage_class = current_class or ""
        has = f"uses storage class {current_class}" if current_class else \
            "has no storage class"
        problems.append(Problem(
            "StorageClassImmutable",
            f"PersistentVolumeClaim {name} {has}; a claim's class can not change, so "
            f"{spec.storage_class} is not applied (delete the claim to start over with it)"))
    elif not spec.storage_class:
        storage_class = current_class  # keep what the default class filled in
    return size, storage_class, problems, resize


def made_for(mirror: Obj, obj: Obj) -> bool:
    """Labelled as eventop's object for a mirror of this name (possibly an earlier one)."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return (labels.get(MANAGED_BY_LABEL) == MANAGED_BY
            and labels.get("app.kubernetes.io/instance") == build.label_value(
                mirror["metadata"]["name"]))


def in_the_way(mirror: Obj, existing: list[Obj | None]) -> list[Obj]:
    """The objects at the mirror's names that eventop did not create for it."""
    return [obj for obj in existing
            if obj is not None and not is_owned_by(obj, mirror["metadata"]["uid"])
            and not made_for(mirror, obj)]


def foreign_objects(in_way: list[Obj]) -> Problem | None:
    """A blocking problem if an object with one of our names exists that eventop did not
    create for this mirror (``in_way``, see :func:`in_the_way` and the module docstring,
    decision 4)."""
    foreign = [f"{obj.get('kind')} {obj['metadata']['name']}" for obj in in_way]
    if not foreign:
        return None
    them, verb = ("them", "exist and were") if len(foreign) > 1 else ("it", "exists and was")
    return Problem("NameConflict",
                   f"{', '.join(foreign)} already {verb} not created by eventop for this "
                   f"mirror; rename or remove {them} (nothing was changed)")


#: Pod Security levels that refuse a pod with a hostPort (only ``privileged`` allows one).
HOST_PORT_REFUSED = ("baseline", "restricted")
ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"


def pod_security_refusal(namespace: Obj | None, spec: MirrorSpec) -> Problem | None:
    """Why the node proxies may not be admitted: the namespace's Pod Security level refuses
    their hostPort, unless the namespace is exempted or another policy lets them in.

    The refusal is seen only in the DaemonSet's ``FailedCreate`` Events (its status just
    never counts a pod), so the mirror says it, but only in ``Ready`` and only while no
    node proxy runs (see :func:`.status.compute_status`): the label alone does not prove a
    refusal, and running proxies must not read as a problem. The objects are still applied:
    relabelling the namespace is enough, the DaemonSet controller retries. A namespace
    without the label follows the cluster's default level, which the API does not show:
    nothing is said then.
    """
    level = (((namespace or {}).get("metadata") or {}).get("labels") or {}).get(ENFORCE_LABEL)
    if level not in HOST_PORT_REFUSED:
        return None
    name = ((namespace or {}).get("metadata") or {}).get("name")
    return Problem(POD_SECURITY,
                   f"namespace {name} enforces Pod Security level {level!r} "
                   f"({ENFORCE_LABEL}), which refuses the node proxies' hostPort "
                   f"{spec.host_port} unless the namespace is exempted; label the namespace "
                   f"{ENFORCE_LABEL}=privileged or put the mirror in another namespace")


def refusal_text(message: str) -> str:
    """The API server's refusal without the Go struct dump some carry (a refused claim
    resize prints the whole ``core.PersistentVolumeClaimSpec{...}`` diff after its reason,
    joined onto one line by the engine): its first sentence is what helps."""
    cut = _GO_DUMP.search(message)
    return message[:cut.start()].rstrip(" :") if cut else message


_GO_DUMP = re.compile(r"\s+[a-z][\w]*\.[A-Z]\w*\{")


def write_problems(outcome: Outcome, spec: MirrorSpec, resize: bool) -> list[Problem]:
    """What the API server refused, or someone created at our names meanwhile."""
    problems = []
    for error in outcome.refused:
        refusal = f"({error.status} {error.reason}): {refusal_text(error.message)}"
        if error.kind == "PersistentVolumeClaim" and resize:
            problems.append(Problem("ResizeRefused", "the API server refused to resize "
                                    f"PersistentVolumeClaim {error.name} to {spec.size} "
                                    f"{refusal}"))
        else:
            problems.append(Problem("ApplyFailed", f"{error.kind} {error.name} was refused "
                                                   f"{refusal}"))
    if outcome.conflicts:
        problems.append(Problem("NameConflict", ", ".join(
            f"{c.kind} {c.name}" for c in outcome.conflicts) + " were created by someone "
            "else meanwhile; rename or remove them (they were not changed)"))
    return problems


# -- the function the engine calls -----------------------------------------------------


def desired(mirror: Obj, reads: Reads) -> Desired:
    """The mirror's objects and status (see the module docstring)."""
    spec = parse_spec(mirror)
    ns = mirror["metadata"]["namespace"]
    names = Names.of(mirror["metadata"]["name"])
    existing = {
        "pvc": reads.get(PVC, names.pvc, ns),
        "headless": reads.get(SERVICE, names.headless_service, ns),
        "service": reads.get(SERVICE, names.service, ns),
        "sts": reads.get(STATEFULSET, names.statefulset, ns),
        "ds": reads.get(DAEMONSET, names.daemonset, ns),
    }
    workloads = (_owned(existing["sts"], mirror), _owned(existing["ds"], mirror))
    everyone = reads.list(MIRROR)
    holders = port_holders(spec.host_port, everyone, lambda m: _owned(reads.get(
        DAEMONSET, Names.of(m["metadata"]["name"]).daemonset, m["metadata"]["namespace"]), m))
    problem = host_port_conflict(mirror, spec.host_port, everyone, holders)
    orphans = orphaned_port_holders(mirror, spec.host_port, reads.list(DAEMONSET))
    problem = problem or orphaned_port_conflict(spec.host_port, orphans)
    version = None
    if problem is None:
        secret = reads.get(SECRET, spec.credentials_secret, ns) \
            if spec.credentials_secret else None
        problem, version = check_credentials(mirror, spec, secret)
    in_way = in_the_way(mirror, list(existing.values()))
    problem = problem or foreign_objects(in_way)
    if problem is not None:
        blocked = problem
        return _reporting(mirror, [], prune=False, summary=f"held back: {blocked.reason}",
                          problems=lambda _outcome: [blocked],
                          workloads=lambda _outcome: workloads,
                          holds=held_port(mirror, spec, workloads[1]), held_back=True,
                          # removing one (as NameConflict, or the orphan's HostPortConflict,
                          # asks) runs the mirror again
                          blocked_by=in_way + orphans)
    size, storage_class, problems, resize = plan_pvc(existing["pvc"], spec)
    pod_security = pod_security_refusal(reads.get(NAMESPACE, ns), spec)
    objects = build.desired_objects(mirror, spec, pvc_size=size, storage_class=storage_class,
                                    credentials_version=version)
    return _reporting(
        mirror, [Child(obj, force=True) for obj in objects], prune=True,
        problems=lambda outcome: problems + write_problems(outcome, spec, resize),
        workloads=lambda outcome: (_in_place(outcome, "StatefulSet") or workloads[0],
                                   _in_place(outcome, "DaemonSet") or workloads[1]),
        holds=spec.host_port, pod_security=pod_security)


def _reporting(mirror: Obj, children: list[Child], *, prune: bool, summary: str | None = None,
               problems: Callable[[Outcome], list[Problem]],
               workloads: Callable[[Outcome], tuple[Obj | None, Obj | None]],
               holds: int | None, held_back: bool = False,
               blocked_by: list[Obj] | None = None,
               pod_security: Problem | None = None) -> Desired:
    """``children`` with the status and transition Events computed once from the Outcome
    (``now`` only dates a condition that changes). ``holds`` is the port the mirror
    holds after this run (recorded in its status); ``held_back``: this generation's objects
    are not applied, the previous ones (if any) stay; ``pod_security``: what explains node
    proxies that do not run (see :func:`pod_security_refusal`)."""
    computed: dict[str, Obj] = {}

    def status(outcome: Outcome) -> Obj:
        if "status" not in computed:
            sts, ds = workloads(outcome)
            computed["status"] = compute_status(mirror, sts, ds, problems=problems(outcome),
                                                now=now_rfc3339(), holds=holds,
                                                held_back=held_back,
                                                pod_security=pod_security)
        return computed["status"]

    def events(outcome: Outcome) -> list[Note]:
        return transition_notes(mirror.get("status") or {}, status(outcome))

    meta = mirror["metadata"]
    return Desired(children=children, status=status, events=events, prune=prune,
                   blocked_by=blocked_by or [],
                   summary=summary and f"RegistryMirror {meta['namespace']}/{meta['name']}: "
                                       f"{summary}")


def _owned(obj: Obj | None, mirror: Obj) -> Obj | None:
    """The object if this very mirror (by uid) owns it, else None (not ours to report)."""
    if obj is None or not is_owned_by(obj, mirror["metadata"]["uid"]):
        return None
    return obj


def _in_place(outcome: Outcome, kind: str) -> Obj | None:
    return next((o for o in outcome.in_place if o.get("kind") == kind), None)
