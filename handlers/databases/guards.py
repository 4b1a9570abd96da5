"""What a run of a live Database checks before it writes, each found on a real v1.24 API
server: another Database of the namespace whose Services take this one's names, a Service
port edited by hand that server-side apply can not put back, and a storage class the spec
asks for that a claim can not change to. Pure: each reads the Database, its spec and what
:mod:`.observe` saw.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eventop.handlers.databases import observe, workload
from eventop.handlers.databases.observe import Observed
from eventop.handlers.databases.spec import DatabaseSpec, Names

Obj = dict[str, Any]


def storage_class_refused(spec: DatabaseSpec, observed: Observed) -> str | None:
    """Why a ``storageClassName`` the spec asks for is not applied, if it is not: a claim's
    class is immutable, and so are a StatefulSet's volume claim templates. The data volumes
    (the serving StatefulSet's template) and the backup volume keep the class they were made
    with; a class added or changed in the spec was silently ignored (found on a real v1.24
    API server), so it is reported, as a shrunk size is by the mirrors."""
    found = []
    serving = sorted(observed.statefulsets,
                     key=lambda s: int(s["metadata"]["labels"][workload.MAJOR_LABEL]))
    template = observe.claim_template(serving[-1]) if serving else None
    if template is not None and spec.storage_class:
        have = (template.get("spec") or {}).get("storageClassName")
        if have != spec.storage_class:
            found.append(f"spec.storage.storageClassName {spec.storage_class} is not applied: "
                         "the data volumes were made "
                         + (f"with class {have}" if have else "without a class (the "
                                                               "cluster's default)"))
    backup = observed.backup_pvc
    if backup is not None and spec.backup_class:
        have = (backup.get("spec") or {}).get("storageClassName")
        if have != spec.backup_class:
            found.append(f"spec.backup.storage.storageClassName {spec.backup_class} is not "
                         f"applied: PersistentVolumeClaim {backup['metadata']['name']} "
                         + (f"uses class {have}" if have else "has no class"))
    if not found:
        return None
    return ("; ".join(found) + ". A claim's storage class can not change; to move the data, "
            "restore a backup into a new Database made with that class")


@dataclass(frozen=True)
class Collision:
    """Another Database's Service has the name of one of this one's: ``client`` (the
    Service the credentials Secret's ``host`` names) or ``headless``; ``message`` says
    which and what to do."""

    mine: str
    message: str

    @property
    def address(self) -> bool:
        """The client Service is the other's: ``host`` and ``uri`` would send clients to
        the other Database's servers. A headless Service leaves the address right."""
        return self.mine == "client"


def name_collision(db: Obj, observed: Observed) -> Collision | None:
    """Which of this Database's Services another Database of its namespace names the same
    (Database ``a``'s headless Service ``a-hl`` is Database ``a-hl``'s client Service), if
    one does; None when none does, or this one is the older of the two (then the Service
    is its own: the other one gives way).

    The two would fight over the Service: whichever came second got a ChildConflict that
    said to delete or rename the Service (which only moves the breakage), and its Secret's
    ``host`` named the other Database's Service. Nothing is renamed instead (a
    StatefulSet's serviceName is immutable, and Databases are upgraded in place): the newer
    Database writes nothing and says which one to rename."""
    mine = Names.of(db["metadata"]["name"])
    own = {mine.service: "client", mine.headless: "headless"}

    def age(obj: Obj) -> tuple[str, str]:
        meta = obj["metadata"]
        return (str(meta.get("creationTimestamp") or ""), str(meta["name"]))
    for other in sorted(observed.neighbours, key=age):
        if age(other) > age(db):
            continue  # the newer one gives way
        theirs = Names.of(other["metadata"]["name"])
        for their_name, their_kind in ((theirs.service, "client"),
                                       (theirs.headless, "headless")):
            if their_name in own:
                return Collision(own[their_name], (
                    f"Database {other['metadata']['name']}'s {their_kind} Service is named "
                    f"{their_name}, the name of this Database's {own[their_name]} Service; "
                    "rename one of the two (create it under another name, restore a backup "
                    "into it, then delete this one)"))
    return None


def _port_key(port: Obj) -> tuple[Any, str]:
    return port.get("port"), str(port.get("protocol") or "TCP")


def service_ports(children: list[Obj], observed: Observed) -> list[Obj]:
    """Merge patches setting the ports of its Services whose ports an apply can not put
    back: a port someone edited by hand (``kubectl patch``) is that manager's list item, and
    server-side apply merges a Service's ports by port number, so the desired one was
    added beside it under the same name and every apply was refused as a duplicate (found
    on a real v1.24 API server: Ready=False WriteRefused until the Service was deleted). A
    JSON merge patch replaces the list whole, with the ``patch`` verb the router has, and
    leaves the rest (the clusterIP clients use) as it is; the Service's apply waits for the
    next run (:attr:`Plan.held`). A port of its own it no longer wants (a changed
    spec.port) is put back the same way: the apply would remove it too, but the patch is
    as right, and a port the handler's patch set is an Update entry of its own that a later
    apply does not remove."""
    live = {s["metadata"]["name"]: s for s in observed.services}
    fixes = []
    for child in children:
        current = live.get(child["metadata"]["name"]) if child["kind"] == "Service" else None
        if current is None:
            continue
        want = child["spec"]["ports"]
        have = (current.get("spec") or {}).get("ports") or []
        wanted_keys = {_port_key(p) for p in want}
        names = {p.get("name") for p in want}
        strays = [p for p in have if _port_key(p) not in wanted_keys and p.get("name") in names]
        if strays:
            fixes.append({"apiVersion": "v1", "kind": "Service",
                          "metadata": {"name": child["metadata"]["name"],
                                       "namespace": child["metadata"]["namespace"]},
                          "spec": {"ports": want}})
    return fixes

