"""The demo's outside world: changes made to the cluster, what must follow, and the report."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from demo.controllers import job_finished, rolled_out, statefulset_controller
from eventop.engine import PARENT_UID_LABEL
from eventop.handlers.databases.status import WARNING_REASONS as DATABASE_WARNINGS
from eventop.kube import Kube, KubeError
from eventop.testing.cluster import LocalCluster, world_copy
from eventop.testing.recordings import replay

REPO = Path(__file__).resolve().parents[1]

Obj = dict[str, Any]
GROUP = "eventop.dev/v1"
CR_KINDS = ("RegistryMirror", "CopyRule", "ExchangeRate", "Database")
OWNED_KINDS = (("v1", "ConfigMap"), ("v1", "Secret"), ("v1", "Service"),
               ("v1", "PersistentVolumeClaim"), ("apps/v1", "StatefulSet"),
               ("apps/v1", "DaemonSet"), ("batch/v1", "Job"), ("batch/v1", "CronJob"))
# What a Database keeps without owning it (it outlives the Database): labelled with its uid.
KEPT_KINDS = (("v1", "Secret"), ("v1", "PersistentVolumeClaim"))


def load_examples(folder: Path) -> list[Obj]:
    docs: list[Obj] = []
    seen: set[tuple[str, str, str]] = set()
    for path in sorted(folder.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc:
                continue
            meta = doc.get("metadata") or {}
            key = (doc.get("kind", ""), meta.get("namespace", ""), meta.get("name", ""))
            if key not in seen:  # a Namespace each file that needs it declares
                seen.add(key)
                docs.append(doc)
    # Namespaces and Secrets first: the custom resources refer to them.
    order = {"Namespace": 0, "Secret": 1, "ConfigMap": 1}
    return sorted(docs, key=lambda d: order.get(d.get("kind", ""), 2))


def objects_by_owner(kube: Kube) -> dict[str, list[Obj]]:
    """Every object of the kinds eventop creates, indexed by the uid of each owner."""
    by_owner: dict[str, list[Obj]] = {}
    for api_version, kind in OWNED_KINDS:
        for obj in kube.list(api_version, kind):
            for ref in obj["metadata"].get("ownerReferences") or []:
                by_owner.setdefault(ref.get("uid", ""), []).append(obj)
    return by_owner


def kept_by_parent(kube: Kube) -> dict[str, list[Obj]]:
    """The objects a handler keeps without owning them, indexed by the uid of their parent:
    a Database's credentials Secret, backup volume and data volumes."""
    kept: dict[str, list[Obj]] = {}
    for api_version, kind in KEPT_KINDS:
        for obj in kube.list(api_version, kind, label_selector=PARENT_UID_LABEL):
            uid = obj["metadata"]["labels"][PARENT_UID_LABEL]
            kept.setdefault(uid, []).append(obj)
    return kept


class Expectations:
    """What must be true once the handlers converged, checked against the API server."""

    def __init__(self, played: bool = False, namespaces: list[str] | None = None) -> None:
        self.gone: list[tuple[str, str, str | None]] = []  # (uid, kind/name, namespace)
        # The demo plays the StatefulSet and Job controllers (local API server): a Database
        # must then get as far as initialized, with its backup CronJob.
        self.played = played
        #: Where the demo's custom resources are (None: everywhere, the local API server);
        #: on a real cluster, the user's own resources are not the demo's to judge.
        self.namespaces = namespaces

    def owner_deleted(self, obj: Obj) -> None:
        meta = obj["metadata"]
        self.gone.append((meta.get("uid", ""), f"{obj['kind']}/{meta['name']}",
                          meta.get("namespace")))

    def missing(self, kube: Kube) -> list[str]:
        problems: list[str] = []
        by_owner = objects_by_owner(kube)
        for kind in CR_KINDS:
            for ns in self.namespaces or [None]:
                for cr in kube.list(GROUP, kind, ns):
                    problems += _cr_problems(cr, by_owner.get(cr["metadata"]["uid"], []),
                                             self.played)
        for uid, what, ns in self.gone:
            left = by_owner.get(uid, [])
            if left:
                names = ", ".join(f"{o['kind']}/{o['metadata']['name']}" for o in left)
                problems.append(f"{what} in {ns or 'cluster'} was deleted but left {names}")
        return problems

    def wait(self, kube: Kube, timeout: float,
             abort: Callable[[], str | None] | None = None,
             step: Callable[[], None] | None = None) -> list[str]:
        """Wait until nothing is missing; return what still is after ``timeout``, or as soon
        as ``abort`` says why waiting is pointless (a process exited). ``step`` runs before
        each look (the controllers the demo plays)."""
        deadline = time.monotonic() + timeout
        problems = ["not checked yet"]
        while time.monotonic() < deadline:
            try:
                if step:
                    step()
                problems = self.missing(kube)
            except KubeError as exc:
                problems = [f"API error while checking: {exc}"]
            if not problems:
                return []
            reason = abort() if abort else None
            if reason:
                return [reason, *problems]
            time.sleep(1.0)
        return problems


def _cr_problems(cr: Obj, owned: list[Obj], played: bool = False) -> list[str]:
    meta, status = cr["metadata"], cr.get("status") or {}
    where = f"{cr['kind']} {meta.get('namespace') + '/' if meta.get('namespace') else ''}" \
            f"{meta['name']}"
    if status.get("observedGeneration") != meta.get("generation"):
        return [f"{where}: generation {meta.get('generation')} not observed yet "
                f"(status.observedGeneration={status.get('observedGeneration')})"]
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    degraded = conditions.get("Degraded", {})
    if cr["kind"] == "ExchangeRate":
        cms = [o for o in owned if o["kind"] == "ConfigMap"]
        if not cms or cms[0].get("data", {}).get("currency") != cr["spec"]["currency"]:
            return [f"{where}: no ConfigMap with the {cr['spec']['currency']} rate"]
    if cr["kind"] == "RegistryMirror" and degraded.get("reason") != "HostPortConflict":
        kinds = sorted(o["kind"] for o in owned)
        want = sorted(["PersistentVolumeClaim", "StatefulSet", "Service", "Service",
                       "DaemonSet"])
        if kinds != want:
            return [f"{where}: owns {kinds}, expected {want}"]
    if cr["kind"] == "Database":
        kinds = sorted(o["kind"] for o in owned)
        if not {"ConfigMap", "Service", "StatefulSet"} <= set(kinds) or \
                kinds.count("Service") != 2:
            return [f"{where}: owns {kinds}, expected a ConfigMap, two Services and a "
                    "StatefulSet"]
        said = {t: f"{t}={c.get('status')}({c.get('reason')})" for t, c in conditions.items()}
        backups = conditions.get("BackupHealthy", {}).get("reason")
        if played and ("CronJob" not in kinds or backups in (None, "NotScheduled")
                       or said.get("Initialized") != "Initialized=True(Initialized)"
                       or said.get("Ready") != "Ready=True(Running)"):
            return [f"{where}: not running, initialized and scheduling backups yet "
                    f"({', '.join(said.values())}; owns {kinds})"]
    if "Ready" not in conditions:
        return [f"{where}: no Ready condition in status"]
    return []


# Sources for the example CopyRules, so the report shows copies being made.
DEMO_SOURCES: list[Obj] = [
    {"apiVersion": "v1", "kind": "ConfigMap",
     "metadata": {"name": "team-settings", "namespace": "default",
                  "labels": {"copyrator": "true"}},
     "data": {"log-level": "info", "registry-mirror": "localhost:5001"}},
    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "platform"}},
    {"apiVersion": "v1", "kind": "ConfigMap",
     "metadata": {"name": "corporate-ca", "namespace": "platform",
                  "labels": {"eventop.dev/publish": "ca-bundle"}},
     "data": {"ca.crt": "-----BEGIN CERTIFICATE-----\n(demo)\n-----END CERTIFICATE-----\n"}},
]


def _owner_kind(obj: Obj) -> str | None:
    refs = obj["metadata"].get("ownerReferences") or []
    return refs[0].get("kind") if refs else None


def _where(obj: Obj) -> str:
    meta = obj["metadata"]
    return f"{meta['namespace'] + '/' if meta.get('namespace') else ''}{meta['name']}"


class World:
    kube: Kube

    def put(self, obj: Obj) -> None:
        raise NotImplementedError

    def namespaces(self) -> list[str] | None:
        return None

    def apply_examples(self, examples: list[Obj], expect: Expectations) -> None:
        for obj in [*examples, *DEMO_SOURCES]:
            self.put(obj)

    def refresh(self, router_url: str) -> str:
        """Send the refresh event the CronJob sends, through the same CLI."""
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "eventop.watcher", "emit",
                 "dev.eventop.exchangerates.refresh", "--sink", router_url],
                cwd=REPO, capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired:
            return (f"FAILED: the router at {router_url} did not accept it within 120s "
                    "(see the router's log)")
        out = (proc.stdout + proc.stderr).strip().splitlines()
        return ("accepted" if proc.returncode == 0 else f"FAILED (exit {proc.returncode})") + (
            f": {out[-1]}" if out else "")


class LocalWorld(World):
    """The embedded local API server; ``kubeconfig`` is written for kubectl to reach it."""

    def __init__(self, cluster: LocalCluster, kubeconfig: Path) -> None:
        self.cluster = cluster
        self.kube = cluster.kube
        self.kubeconfig = cluster.kubeconfig(kubeconfig)

    def put(self, obj: Obj) -> None:
        self.cluster.put(obj)

    def play_controllers(self) -> list[str]:
        """Play, for the Databases, the components the local API server lacks (it runs no
        kubelet, StatefulSet or Job controller), writing what they would write: a Database's
        StatefulSet gets its claims and reports every pod Ready, its init Job is reported
        Complete. Nothing runs. Returns what it did, to be said."""
        said: list[str] = []
        for sts in self.kube.list("apps/v1", "StatefulSet"):
            if _owner_kind(sts) == "Database" and not rolled_out(sts):
                claims = statefulset_controller(self.kube, self.cluster.put, sts)
                replicas = sts["spec"].get("replicas", 1)
                said.append(f"StatefulSet {_where(sts)}: {replicas} of {replicas} pods "
                            "reported Ready" + (f", claims {', '.join(claims)} made"
                                                if claims else "")
                            + " (as the StatefulSet controller and the kubelet would)")
        for job in self.kube.list("batch/v1", "Job",
                                  label_selector="app.kubernetes.io/component=init"):
            if _owner_kind(job) == "Database" and not (job.get("status") or {}).get(
                    "conditions"):
                job_finished(self.kube, job["metadata"]["name"], job["metadata"]["namespace"])
                said.append(f"Job {_where(job)}: reported Complete (as the Job controller "
                            "would; no pod ran, no SQL was executed)")
        return said

    def replay_recordings(self, folder: Path, expect: Expectations) -> int:
        """Make the recorded changes happen again, in order, paced like a live cluster (the
        watcher posts them)."""

        def paced(change: str, obj: Obj) -> None:
            if change == "delete" and obj.get("apiVersion") == GROUP:
                expect.owner_deleted(obj)
            time.sleep(0.05)

        return len(replay(self.cluster, [folder / "copy-rules", folder / "mirrors-and-rates"],
                          paced))


class ClusterWorld(World):
    """A real cluster: everything goes into one demo namespace, made by a separate manager."""

    namespace = "eventop-demo"

    def __init__(self, kubeconfig: str) -> None:
        self.kube = Kube.connect(kubeconfig=kubeconfig)
        self.world = Kube.connect(kubeconfig=kubeconfig)
        self.world.field_manager = "eventop-demo"
        missing = self.kube.missing_kinds({(GROUP, kind) for kind in CR_KINDS})
        if missing:
            raise KubeError(f"the cluster does not serve {', '.join(missing)}: install the "
                            "CRDs first (kubectl apply -k crds/)")
        self.world.apply({"apiVersion": "v1", "kind": "Namespace",
                          "metadata": {"name": self.namespace}})

    def namespaces(self) -> list[str] | None:
        return [self.namespace]

    def apply_examples(self, examples: list[Obj], expect: Expectations) -> None:
        # Not the demo's copy sources: labelled for the example CopyRules, which are not
        # applied here, they would be copied by the cluster's own rules.
        for obj in examples:
            self.put(obj)

    def put(self, obj: Obj) -> None:
        obj = world_copy(obj)
        obj["metadata"].pop("uid", None)
        if obj["kind"] in ("Namespace", "CopyRule"):
            return  # cluster-wide effects: not in someone's real cluster
        if obj["kind"] == "Database":
            # Its finalizer keeps it (and the namespace) until eventop's router has kept its
            # data, and the demo's router stops when the demo does: it would never go.
            return
        obj["metadata"]["namespace"] = self.namespace
        self.world.apply(obj)


# What a condition the demo may show means, and what to do about it.
EXPLAIN = {
    "ResizeRefused": (
        "the mirror asks for a bigger cache than its PersistentVolumeClaim has, and the API "
        "server refused to grow the claim (its StorageClass does not allow volume expansion, "
        "or the claim is not bound yet); the mirror keeps its cache at the old size. To grow "
        "it: use a StorageClass with allowVolumeExpansion: true, or delete the claim (the "
        "cache is lost) and the mirror recreates it at the new size."),
    "HostPortConflict": (
        "another RegistryMirror already uses this hostPort on the nodes; give each mirror "
        "its own spec.hostPort."),
}
EXPLAIN_LOCAL = {
    "StorageClassImmutable": (
        "the replayed recording made this mirror's claim without a storage class before the "
        "example asked for one, and a claim's class can not change; the mirror keeps the "
        "claim it has. On a cluster, delete the claim to start over with the class."),
    "RegistryNotReady": (
        "the local API server runs no kubelet or workload controllers, so the registry's "
        "pods never start here; on a cluster the mirror turns Ready once its StatefulSet "
        "and DaemonSet are."),
}


def _is_problem(type_: str, status: str, reason: str) -> bool:
    """Ready not True, Degraded True, Initialized or BackupHealthy False (Unknown: not yet),
    or a reason the Database handler warns about (a refused downgrade, a failed snapshot)."""
    if type_ == "Ready":
        return status != "True"
    if type_ in ("Initialized", "BackupHealthy"):
        return status == "False"
    return (type_ == "Degraded" and status == "True") or reason in DATABASE_WARNINGS


def _explained(condition: Obj, local: bool, explained: set[str]) -> str | None:
    """The condition's message and what it means (once per reason: ``explained`` remembers),
    for a condition that reports a problem."""
    reason = condition.get("reason", "")
    bad = _is_problem(condition.get("type", ""), condition.get("status", ""), reason)
    meaning = EXPLAIN.get(reason) or (EXPLAIN_LOCAL.get(reason) if local else None)
    if not bad or not (meaning or condition.get("message")):
        return None
    said = f"{condition['type']}={condition['status']}({reason}): {condition.get('message', '')}"
    if meaning and reason in explained:
        return said + f" ({reason}: see above)"
    explained.add(reason)
    return said + (f"\n          what it means: {meaning}" if meaning else "")


def report(kube: Kube, namespaces: list[str] | None, local: bool = False) -> None:
    """Print every custom resource with its status and the objects it owns (and, for a
    Database, those it keeps without owning); a condition that reports a problem is printed
    with its message and, when known, what it means. Secrets show their keys, never a
    value."""
    by_owner = objects_by_owner(kube)
    kept = kept_by_parent(kube)
    explained: set[str] = set()
    for kind in CR_KINDS:
        items = kube.list(GROUP, kind)
        items = [i for i in items if namespaces is None
                 or i["metadata"].get("namespace") in namespaces]
        print(f"\n{kind} ({len(items)})")
        if kind == "Database" and local and items:
            print("  (the local API server runs no kubelet, StatefulSet or Job controller: "
                  "the demo played them,\n   reporting pods Ready and init Jobs Complete; "
                  "no PostgreSQL ran, and no backup has run yet)")
        for cr in items:
            meta, status = cr["metadata"], cr.get("status") or {}
            conds = ", ".join(f"{c['type']}={c['status']}({c.get('reason', '')})"
                              for c in status.get("conditions") or [])
            extra = {k: v for k, v in status.items()
                     if k not in ("conditions", "observedGeneration", "conflictList")}
            print(f"  {meta.get('namespace', '-')}/{meta['name']}  {conds}  {extra}")
            for condition in status.get("conditions") or []:
                said = _explained(condition, local, explained)
                if said:
                    print(f"      ! {said}")
            for obj in _sorted(by_owner.get(meta["uid"], [])):
                print(f"      └ {_line(obj)}")
            outliving = _sorted(kept.get(meta["uid"], []))
            if outliving:
                print("      kept, not owned (they outlive it):")
            for obj in outliving:
                print(f"      └ {_line(obj)}")


def _sorted(objects: list[Obj]) -> list[Obj]:
    return sorted(objects, key=lambda o: (o["kind"], o["metadata"].get("namespace", ""),
                                          o["metadata"]["name"]))


def _line(obj: Obj) -> str:
    """One object of the report, with what matters about it. A Secret shows its keys only."""
    meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
    detail = ""
    if obj["kind"] == "ConfigMap" and "rate" in (obj.get("data") or {}):
        d = obj["data"]
        detail = f"  1 {d.get('base')} = {d.get('rate')} {d.get('currency')} ({d.get('date')})"
    elif obj["kind"] == "Secret":
        detail = f"  keys {', '.join(sorted(obj.get('data') or {}))} (values not shown)"
    elif obj["kind"] == "StatefulSet":
        image = spec["template"]["spec"]["containers"][0].get("image")
        detail = f"  {status.get('readyReplicas', 0)}/{spec.get('replicas', 1)} ready, {image}"
    elif obj["kind"] == "CronJob":
        pod = spec["jobTemplate"]["spec"]["template"]["spec"]
        detail = f"  schedule {spec.get('schedule')!r}, {pod['containers'][0].get('image')}"
    elif obj["kind"] == "Job":
        finished = [c["type"] for c in status.get("conditions") or []
                    if c.get("type") in ("Complete", "Failed") and c.get("status") == "True"]
        detail = f"  {finished[0] if finished else 'running'}"
    elif obj["kind"] == "PersistentVolumeClaim":
        detail = f"  {((spec.get('resources') or {}).get('requests') or {}).get('storage')}"
    return f"{obj['kind']} {meta.get('namespace')}/{meta['name']}{detail}"
