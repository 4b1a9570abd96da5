"""The reclaim policy of a Database's PersistentVolumes: the data kept safe before anything
is deleted, not only once a running router sees the deletion.

A claim's deletion reclaims its PersistentVolume as the volume's
``persistentVolumeReclaimPolicy`` says, and dynamic provisioning makes them ``Delete``: the
volume, data and all, goes with its claim. The Database's finalizer holds the Database (and
its namespace) but not its claims: a namespace deleted while no router runs loses them at
once, and their volumes are reclaimed before a router is back to act (found on a real
v1.24 API server). So, from the moment a volume is bound, every run of a live Database sets
the volumes whose data must outlive a claim deletion to ``Retain``:

* the backup volume's, under every ``deletionPolicy`` (the backups outlive the Database);
* the data volumes', under ``Snapshot`` and ``Retain`` (read as written: a policy made
  invalid since keeps them too).

The policy a volume had is recorded in the annotation :data:`RECLAIM_ANNOTATION` on the
volume, so it can be given back: when the policy says the data volumes are deleted
(``Delete``, a Database switched to it while alive; ``Snapshot`` once the snapshots are
ready or the final backup is complete, before the claims are deleted), the data volumes
carrying the annotation get their policy back, and deleting the claim reclaims the storage
as before (no ``Released`` volume left behind). Only the volumes its data claims are bound
to now: a ``Released`` one whose claim went before (deleted by hand, never snapshotted; or
an earlier Database's of this name, found by the same ``claimRef`` name) stays Retain. A
volume already ``Retain`` of its own (no annotation: a StorageClass with ``reclaimPolicy:
Retain``, an administrator) is left alone and never given anything back.

Pure: the patches are ``Desired.patch`` entries, applied by the engine only where the
cached volume does not hold them yet.
"""

from __future__ import annotations

from typing import Any

from eventop.handlers.databases import observe
from eventop.handlers.databases.observe import Observed
from eventop.handlers.databases.spec import Names

Obj = dict[str, Any]

#: On a PersistentVolume eventop set to Retain: the reclaim policy it had before, given
#: back when the data is to be deleted. Absent: the volume's policy is its own.
RECLAIM_ANNOTATION = "eventop.dev/reclaim-policy"
RETAIN = "Retain"
#: The policies a volume can be given back (an annotation edited to anything else is not
#: trusted with the data: the volume stays Retain, the annotation goes).
_GIVEN_BACK = ("Delete", "Recycle")


def keeps_data(db: Obj) -> bool:
    """Whether the data volumes outlive their claims: unless ``deletionPolicy`` is Delete
    (read as written: a spec invalid in another field, or an unknown policy, must not lose
    them)."""
    return (db.get("spec") or {}).get("deletionPolicy", "Snapshot") != "Delete"


def reclaim_policy(pv: Obj) -> str:
    return str((pv.get("spec") or {}).get("persistentVolumeReclaimPolicy") or "")


def original_policy(pv: Obj) -> str | None:
    """The reclaim policy the volume had before eventop set it to Retain; None when eventop
    did not (its policy is its own)."""
    annotations = (pv.get("metadata") or {}).get("annotations") or {}
    return annotations.get(RECLAIM_ANNOTATION) or None


def retain(pv: Obj) -> Obj | None:
    """The patch setting ``pv`` to Retain, recording the policy it had; None when it is
    Retain already (eventop's doing or its own)."""
    had = reclaim_policy(pv)
    if had == RETAIN:
        return None
    return _patch(pv, RETAIN, had or "Delete")


def give_back(pv: Obj) -> Obj | None:
    """The patch giving ``pv`` the reclaim policy eventop recorded, the annotation removed;
    None when eventop never set it (nothing to give back)."""
    had = original_policy(pv)
    if had is None:
        return None
    return _patch(pv, had if had in _GIVEN_BACK else reclaim_policy(pv) or RETAIN, None)


def _patch(pv: Obj, policy: str, annotation: str | None) -> Obj:
    # (a merge patch: None removes the annotation)
    return {"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": pv["metadata"]["name"],
                         "annotations": {RECLAIM_ANNOTATION: annotation}},
            "spec": {"persistentVolumeReclaimPolicy": policy}}


def is_backup(pv: Obj, names: Names) -> bool:
    return observe.claim_of(pv) == names.backup_pvc


def claimed(observed: Observed) -> set[str]:
    """The PersistentVolumes its data claims, as they are now, are bound to (their
    ``volumeName``): not a ``Released`` one whose claim is gone, which may be an earlier
    Database's of this name, kept by its policy or its namespace's deletion."""
    return {str(pvc["spec"]["volumeName"]) for pvc in observed.data_pvcs
            if (pvc.get("spec") or {}).get("volumeName")}


def patches(observed: Observed, names: Names, *, keep_data: bool,
            releasing: bool = False) -> list[Obj]:
    """The patches of this moment: the backup volume's and (``keep_data``) the data
    volumes' PersistentVolumes set to Retain. The volumes of its data claims are given
    their own policy back instead when the data is not kept, or when the claims are
    ``releasing`` (about to be deleted, their data kept elsewhere: snapshots, a final
    backup). A volume no claim is bound to any more is only ever kept: nothing says its
    data is anywhere else."""
    bound = claimed(observed)
    found = []
    for pv in observed.volumes:
        if is_backup(pv, names):
            patch = retain(pv)
        elif pv["metadata"]["name"] in bound:
            patch = retain(pv) if keep_data and not releasing else give_back(pv)
        else:
            patch = retain(pv) if keep_data else None
        if patch is not None:
            found.append(patch)
    return found


def to_give_back(observed: Observed, names: Names) -> list[Obj]:
    """The patches giving the volumes of its data claims their own reclaim policy back
    (before the claims are deleted, so the deletion reclaims the storage). Not a volume
    whose claim is gone already: never snapshotted nor backed up with the claims (deleted
    by hand before), or an earlier Database's of this name; it stays Retain, ``Released``,
    data and all."""
    bound = claimed(observed)
    return [patch for pv in observed.volumes
            if not is_backup(pv, names) and pv["metadata"]["name"] in bound
            if (patch := give_back(pv)) is not None]


def unseen(observed: Observed, *, data: bool = True) -> list[str]:
    """The PersistentVolumes bound claims name that the cache does not hold yet (the
    provisioner made them a moment ago): looked at again shortly, not taken as nothing
    to keep. ``data=False``: the backup volume's only (the data volumes are not kept)."""
    seen = {pv["metadata"]["name"] for pv in observed.volumes}
    claims = [*(observed.data_pvcs if data else []),
              *([observed.backup_pvc] if observed.backup_pvc else [])]
    return sorted({str(pvc["spec"]["volumeName"]) for pvc in claims
                   if observe.is_bound(pvc) and (pvc.get("spec") or {}).get("volumeName")
                   and pvc["spec"]["volumeName"] not in seen})
