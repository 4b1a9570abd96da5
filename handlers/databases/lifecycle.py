"""What a live Database should consist of now: the version that serves, the upgrade steps,
the initial configuration, the backups. A pure function of the Database and its observed
children (:func:`plan`), decided again from scratch on every event.

Upgrades. Raising ``spec.version`` (or changing ``spec.image``) first runs a backup Job on
the running image and waits for it. Then:

* same major: the StatefulSet's image changes and its pods roll (standbys first, the primary
  last); the new version serves once every pod runs it and is ready.
* new major: PostgreSQL's data directory belongs to one major, and ``pg_upgrade`` needs both
  majors' binaries in one container, which the official image does not have. So the new
  major gets its own StatefulSet and volumes beside the old one; once its primary is ready,
  an upgrade Job on the new image makes the old server read-only and copies every role and
  database into the new one (``pg_dumpall --globals-only``, then ``pg_dump | pg_restore``
  per database). Only when that succeeded does the client Service switch to the new
  primary, the backup CronJob move to the new image, and the old StatefulSet go; its
  volumes are kept until the Database is deleted (a way back). A failed copy leaves the old
  server serving, writable again.

Lowering the version is refused (``Progressing=False``, ``DowngradeRefused``): PostgreSQL
can not open a newer data directory with older binaries. So is a changed
``spec.databaseName`` once initialized (``DatabaseNameRefused``): the init Job made that role
and database once, and the credentials Secret keeps naming them (:func:`initialized_name`).
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from eventop.engine import PARENT_UID_LABEL
from eventop.handlers.databases import guards, jobs, observe, status, volumes, workload
from eventop.handlers.databases.observe import COMPLETE, FAILED, Observed
from eventop.handlers.databases.spec import (
    DEFAULT_RESOURCES,
    DELETION_POLICIES,
    PINNED_MINOR,
    DatabaseSpec,
    Names,
    SpecError,
    Version,
    check_resources,
    database_name,
    describe,
    image_for,
    image_version,
    parse_spec,
    resolve,
    size,
)
from eventop.handlers.databases.status import Event, Facts
from eventop.handlers.databases.workload import Passwords
from eventop.kube import MANAGED_BY, MANAGED_BY_LABEL, is_owned_by, label_value

Obj = dict[str, Any]


@dataclass
class Plan:
    """What one reconcile wants.

    ``children`` are owned by the Database (None: leave the children as they are, the spec
    can not be acted on); ``kept`` are applied without an owner, so they outlive it (the
    backup volume, snapshots, and the credentials Secret, which Retain and Snapshot keep:
    the kept data opens with its passwords; Delete deletes it explicitly);
    ``deletions`` are deleted explicitly; ``patches`` set fields in objects it did not make
    (its PersistentVolumes' reclaim policy, see :mod:`volumes`); ``finalize`` lets a
    Database being deleted go (its finalizer removed).
    """

    children: list[Obj] | None
    status: Obj
    kept: list[Obj] = field(default_factory=list)
    deletions: list[Obj] = field(default_factory=list)
    patches: list[Obj] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    finalize: bool = False
    requeue_after: float | None = None
    #: (kind, name) of children not to write this run: a patch of this run puts them right
    held: set[tuple[str, str]] = field(default_factory=set)


#: Events about something the run itself does (not a state it reports): posted by that run
#: even though the status stays the same (else they would only come with a status change).
ACTION_EVENTS = frozenset({"CredentialsRecreated"})


def plan(db: Obj, observed: Observed, new_password: Callable[[], str]) -> Plan:
    """The Database's children, status and Events for this moment."""
    from eventop.handlers.databases import deletion

    deleting = bool(db["metadata"].get("deletionTimestamp"))
    try:
        spec = parse_spec(deletion_spec(db, observed) if deleting else db)
    except SpecError as exc:
        return keep_volumes(db, observed, invalid(db, observed, exc))
    if deleting:
        return deletion.plan(db, initialized_name(db, spec, observed), observed)
    return keep_volumes(db, observed, running(db, spec, observed, new_password))


#: Seconds until a Database that gave way to another of its name's Services looks again
#: (nothing maps the other Database's deletion to it).
COLLISION_RECHECK = 60.0

#: Seconds until a Database whose bound claim names a PersistentVolume the cache has not
#: seen yet looks again (no event of a PersistentVolume runs a Database).
UNSEEN_VOLUME_RECHECK = 2.0


def keep_volumes(db: Obj, observed: Observed, result: Plan) -> Plan:
    """``result`` with the reclaim policy patches of this moment (:mod:`volumes`): while a
    Database lives, the PersistentVolumes of its backup volume and (unless
    ``deletionPolicy`` is Delete) of its data volumes are Retain, so a claim deleted
    without a router running (its namespace deleted) does not take the data with it; a
    policy switched to Delete gives the data volumes their own policy back. A bound claim
    whose volume the cache does not hold yet is looked at again shortly."""
    names = Names.of(db["metadata"]["name"])
    patches = volumes.patches(observed, names, keep_data=volumes.keeps_data(db))
    patches += adopted_claims(db, observed)
    requeue = result.requeue_after
    if volumes.unseen(observed):
        requeue = min(requeue or UNSEEN_VOLUME_RECHECK, UNSEEN_VOLUME_RECHECK)
    return replace(result, patches=[*result.patches, *patches], requeue_after=requeue)


def adopted_claims(db: Obj, observed: Observed) -> list[Obj]:
    """The data claims its own servers use that an earlier Database of its name made (kept
    under Retain and opened again): labelled with its uid, as if made for it, so that its
    deletion applies its policy to them (a deletion leaves claims made for another uid as
    they are, see controller.observe)."""
    uid = db["metadata"]["uid"]
    mine = [f"data-{sts['metadata']['name']}-" for sts in observed.statefulsets]
    return [{"apiVersion": "v1", "kind": "PersistentVolumeClaim",
             "metadata": {"name": pvc["metadata"]["name"],
                          "namespace": pvc["metadata"].get("namespace"),
                          "labels": {PARENT_UID_LABEL: uid}}}
            for pvc in observed.data_pvcs
            if (pvc["metadata"].get("labels") or {}).get(PARENT_UID_LABEL) != uid
            and any(pvc["metadata"]["name"].startswith(prefix) for prefix in mine)]


def _valid(check: Callable[[], object]) -> bool:
    try:
        check()
    except (SpecError, ValueError):
        return False
    return True


def deletion_spec(db: Obj, observed: Observed) -> Obj:
    """For deletion, the spec as far as it matters then, with nothing left in it that the
    handler would refuse: a broken field must not keep a Database from being deleted (its
    finalizer held, nothing said, until the spec is fixed). The version that runs (a
    version edited in the meantime, even an unsupported one, upgrades nothing now); no
    schedule; and a field made invalid since is replaced by what the running objects have,
    else by its default (the deletion makes nothing new from them: the existing
    StatefulSets keep their volume templates, the backup volume its size)."""
    spec = dict(db.get("spec") or {})
    old = db.get("status") or {}
    if old.get("version"):
        spec["version"] = old["version"]
        spec["image"] = old.get("image") or spec.get("image")
    if not _valid(lambda: resolve(Version.parse(spec.get("version", "")), spec.get("image"))):
        spec["version"], spec["image"] = _running_version(observed)
    spec["engine"] = "postgres"
    storage = dict(spec.get("storage") or {})
    if not _valid(lambda: size(storage.get("size"), "spec.storage.size")):
        spec["storage"] = {**storage, "size": _running_size(observed)}
    backup = {k: v for k, v in (spec.get("backup") or {}).items() if k != "schedule"}
    backup_size = (backup.get("storage") or {}).get("size")
    if backup_size and not _valid(lambda: size(backup_size, "spec.backup.storage.size")):
        backup.pop("storage")  # (the backup volume keeps its own size anyway)
    spec["backup"] = backup
    if not _valid(lambda: check_resources(spec.get("resources") or {})):
        spec["resources"] = _running_resources(observed)
    if not _valid(lambda: database_name(db["metadata"]["name"], spec.get("databaseName"))):
        spec.pop("databaseName")  # (the kept Secret says the initialized one)
    if spec.get("deletionPolicy", "Snapshot") not in DELETION_POLICIES:
        spec["deletionPolicy"] = "Snapshot"  # the default, and the one that loses nothing
    return {**db, "spec": spec}


def _running_version(observed: Observed) -> tuple[str, str | None]:
    """(version, image) of the lowest major's StatefulSet; with none, a supported version
    (nothing runs: it names nothing that is made). A label the image's tag contradicts (an
    earlier release ran ``spec.version: "17.9"`` on ``postgres:17.7``, refused now as
    ImageVersionMismatch) gives way to the tag's version: it is what runs, and the
    contradiction held the deletion (its spec invalid, the finalizer kept) for good."""
    for sts in sorted(observed.statefulsets,
                      key=lambda s: int(s["metadata"]["labels"][workload.MAJOR_LABEL])):
        image = observe.sts_image(sts)
        for version in (observe.sts_version(sts), image_version(image or "")):
            if version is not None and _valid(lambda v=version, i=image: resolve(v, i)):
                return str(version), image
    return str(max(PINNED_MINOR)), None


def _running_size(observed: Observed) -> str:
    """The data volume size of a StatefulSet's template; with none, any valid size (a
    StatefulSet made again for a final backup binds the existing claims whatever it asks)."""
    for sts in observed.statefulsets:
        template = observe.claim_template(sts) or {}
        found = (((template.get("spec") or {}).get("resources") or {}).get("requests")
                 or {}).get("storage")
        if found:
            return str(found)
    return "1Gi"


def _running_resources(observed: Observed) -> Obj:
    """The postgres container's resources in a StatefulSet (a server stopped or backed up
    with them is not rolled first); with none, the defaults."""
    for sts in observed.statefulsets:
        containers = sts["spec"]["template"]["spec"].get("containers") or []
        for container in containers:
            if container.get("name") == "postgres" and _valid(
                    lambda c=container: check_resources(c.get("resources") or {})):
                return dict(container.get("resources") or DEFAULT_RESOURCES)
    return DEFAULT_RESOURCES


def initialized_name(db: Obj, spec: DatabaseSpec, observed: Observed) -> DatabaseSpec:
    """The spec with the database name that was initialized: once the init Job made the
    role and database, they are the ones the credentials Secret names (``database``), and
    a changed ``spec.databaseName`` is not applied (the Secret would name a role and
    database that do not exist, and the init Job does not run again). Before that, or
    without a Secret of this Database's, the spec's."""
    secret = observed.secret
    if _initialized_before(db)[0] != "True" or secret is None or not is_ours(secret, db):
        return spec
    encoded = (secret.get("data") or {}).get("database")
    if not encoded:
        return spec
    return replace(spec, database_name=base64.b64decode(encoded).decode())


def invalid(db: Obj, observed: Observed, exc: SpecError) -> Plan:
    """Nothing is changed: an edit that broke the spec must not take the server down."""
    facts = Facts(ready=("False", exc.reason, f"{exc.message}: fix the Database's spec"),
                  phase="Failed", progressing=("False", "InvalidSpec", exc.message),
                  version=(db.get("status") or {}).get("version"),
                  # (the image too: without it the version read as the default image's, and
                  # the spec fixed afterwards as a change of image)
                  image=(db.get("status") or {}).get("image"))
    facts.initialized = _initialized_before(db)
    new, events, _ = status.compute(db, facts, observed, int(
        (db.get("spec") or {}).get("replicas", 1) or 1))
    return Plan(children=None, status=new, events=events,
                finalize=bool(db["metadata"].get("deletionTimestamp")) and not observed.data_pvcs
                and not observed.statefulsets)


def _initialized_before(db: Obj) -> status.Condition:
    cond = observe._condition(db, "Initialized") if db.get("status") else None
    if cond:
        return ("True", str(cond.get("reason")), str(cond.get("message")))
    return ("False", "WaitingForServer", "the server has not started yet")


def is_ours(obj: Obj, db: Obj) -> bool:
    """Owned by this Database or labelled with its uid; or an object eventop made for a
    Database of this name that nothing controls any more (a Secret or backup volume an
    earlier Database kept): adopted, passwords and backups included."""
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    uid = db["metadata"]["uid"]
    if is_owned_by(obj, uid) or labels.get(PARENT_UID_LABEL) == uid:
        return True
    return (not any(r.get("controller") for r in meta.get("ownerReferences") or ())
            and labels.get(MANAGED_BY_LABEL) == MANAGED_BY
            and labels.get("app.kubernetes.io/instance") == label_value(db["metadata"]["name"])
            and labels.get("app.kubernetes.io/name") == workload.APP_NAME)


def passwords(secret: Obj | None, new_password: Callable[[], str]) -> Passwords:
    """The Secret's passwords, each generated only where it has none yet."""
    have = Passwords.from_secret(secret)
    return Passwords(app=have.get("password") or new_password(),
                     superuser=have.get("superuser-password") or new_password(),
                     replication=have.get("replication-password") or new_password())


def serving(db: Obj, spec: DatabaseSpec, observed: Observed) -> tuple[Version, str]:
    """The version (and image) that serves: the status says it; without a status, the
    StatefulSet of the lowest major. Before the database was ever initialized and while no
    server is ready, whatever the spec asks for: there is no data to carry over yet."""
    old = db.get("status") or {}
    if _initialized_before(db)[0] != "True" and not any(
            observe.ready_replicas(sts) for sts in observed.statefulsets):
        return spec.version, spec.image  # nothing served yet: no data to carry over
    if old.get("version"):
        version = Version.parse(old["version"])
        return _tag_read(spec, (version, str(old.get("image") or image_for(version))),
                         observed)
    found = sorted(observed.statefulsets,
                   key=lambda s: int(s["metadata"]["labels"][workload.MAJOR_LABEL]))
    if found:
        sts = found[0]
        major = int(sts["metadata"]["labels"][workload.MAJOR_LABEL])
        version = observe.sts_version(sts) or Version(major)
        return _tag_read(spec, (version, observe.sts_image(sts) or image_for(version)),
                         observed)
    return spec.version, spec.image


def _tag_read(spec: DatabaseSpec, current: tuple[Version, str], observed: Observed
              ) -> tuple[Version, str]:
    """``current``, with the version the image's tag names when that is all that changed:
    a release before the tag was read reported ``spec.version`` as written beside the
    image (``"16"`` with ``postgres:16.4`` as 16; ``"17.9"`` with ``postgres:17.7`` as
    17.9) in status.version and the StatefulSet's label, and comparing that with the tag's
    version read as an upgrade (a rollout onto the same binaries) or as a downgrade refused
    for good (spec.version set as asked changed nothing). When the serving StatefulSet
    already runs ``spec.image`` and the status names it too, the servers run the tag's
    version: it is reported from now on, and nothing rolls (:func:`observe.version_label`)."""
    version, image = current
    tagged = image_version(spec.image)
    sts = observed.statefulset(version.major)
    if (tagged is not None and tagged.minor is not None and tagged == spec.version
            and tagged.major == version.major and image == spec.image
            and sts is not None and observe.sts_image(sts) == spec.image):
        return spec.version, image
    return current


def is_lower(target: Version, running: Version) -> bool:
    if target.major != running.major:
        return target.major < running.major
    if target.minor is None or running.minor is None:
        return False
    return target.minor < running.minor


def running(db: Obj, spec: DatabaseSpec, observed: Observed,
            new_password: Callable[[], str]) -> Plan:
    names = Names.of(spec.name)
    facts = Facts(endpoint=workload.endpoint(spec), secret=names.secret,
                  schedule=spec.schedule, replicas=spec.replicas)
    if observed.secret is not None and not is_ours(observed.secret, db):
        facts.ready = ("False", "SecretConflict",
                       f"Secret {names.secret} exists and was not made by eventop for this "
                       "Database; rename or remove it (nothing was created)")
        facts.phase = "Failed"
        new, events, _ = status.compute(db, facts, observed, spec.replicas)
        return Plan(children=None, status=new, events=events)

    if observed.secret is None and _initialized_before(db)[0] == "True" \
            and not observed.namespace_terminating:  # (there, everything goes)
        facts.events.append((
            "Warning", "CredentialsRecreated",
            f"Secret {names.secret} was deleted and is made again with new passwords, which "
            "the server does not know: restore the deleted Secret (or set the roles' "
            "passwords to the new ones as the postgres user inside the primary's pod)"))
    collision = guards.name_collision(db, observed)
    if collision is not None:
        return _gives_way(db, spec, observed, facts, collision, new_password)
    kept_name = initialized_name(db, spec, observed)
    renamed = None
    if kept_name.database_name != spec.database_name:
        renamed = ("False", "DatabaseNameRefused",
                   f"spec.databaseName {spec.database_name!r} is not applied: the role and "
                   f"database {kept_name.database_name!r} were made when the Database was "
                   f"initialized, and Secret {names.secret} names them; eventop renames "
                   f"neither. Set spec.databaseName back to {kept_name.database_name!r} "
                   "(or restore a backup into a new Database)")
        spec = kept_name
    version, image = serving(db, spec, observed)
    children: list[Obj] = [workload.config_map(spec), workload.headless_service(spec)]
    secret = workload.credentials_secret(spec, passwords(observed.secret, new_password))
    step = Step(serve=(version, image), build=(version, image))
    if (spec.version, spec.image) != (version, image):
        if is_lower(spec.version, version):
            facts.progressing = (
                "False", "DowngradeRefused",
                f"spec.version {spec.version} is lower than the running {version}: PostgreSQL "
                f"can not open a newer data directory with older binaries; set spec.version "
                f"back to {version} or higher (or restore a backup into a new Database)")
        else:
            step = _upgrade(spec, observed, (version, image), facts)
    else:
        facts.progressing = ("False", "Stable",
                             f"PostgreSQL {describe(version, image)}, as spec.version asks: no "
                             "upgrade under way")
    if renamed is not None and facts.progressing[1] == "Stable":  # (an upgrade says more)
        facts.progressing = renamed
    unapplied = guards.storage_class_refused(spec, observed)
    if unapplied is not None and facts.progressing[1] == "Stable":
        facts.progressing = ("False", "StorageClassImmutable", unapplied)
    version, image = step.serve
    built, built_image = step.build
    serving_sts = observed.statefulset(version.major)
    if facts.progressing[1] == "Stable" and observe.rolling_out(serving_sts):
        facts.progressing = ("True", "RollingOut",
                             f"rolling the servers out to the current spec "
                             f"({observe.rollout_progress(serving_sts)})")
    children.append(workload.statefulset(
        spec, (observe.version_label(serving_sts, built, built_image), built_image),
        built.major, claim_template=observe.claim_template(serving_sts)))
    children.append(workload.client_service(spec, version.major))
    children += step.extra
    facts.version, facts.image, facts.serving = str(version), image, serving_sts
    children += _initialization(db, spec, observed, (str(version), image), facts)
    if facts.initialized[0] == "True":
        children.append(jobs.backup_cronjob(spec, (str(version), image), version.major))
    new, events, recheck = status.compute(db, facts, observed, spec.replicas)
    fixes = guards.service_ports(children, observed)
    return Plan(children=children, status=new,
                kept=[secret, workload.backup_pvc(spec, observed.backup_pvc)],
                events=events, requeue_after=recheck, patches=fixes,
                held={(p["kind"], p["metadata"]["name"]) for p in fixes})


def _gives_way(db: Obj, spec: DatabaseSpec, observed: Observed, facts: Facts,
               collision: guards.Collision, new_password: Callable[[], str]) -> Plan:
    """Another Database has the name of one of its Services: nothing is written (the
    children stay as they are), ``Progressing=False NameCollision`` says so.

    ``Ready`` stays about the servers while they serve at their address: with only the
    headless Service's name taken (Database ``a`` beside an older ``a-hl``), its client
    Service ``a`` is its own and applications connect through it; ``Ready=False``, phase
    Failed, said they could not. Only when its client Service is the other's (clients
    reach the other Database) or no server of its runs is ``Ready`` the collision (False,
    phase Failed), and its credentials Secret then loses ``host`` and ``uri`` (they name
    the other's Service). A right address is kept: stripping it broke every application
    pod reading ``uri`` through a ``secretKeyRef``."""
    old = db.get("status") or {}
    version, _ = serving(db, spec, observed)
    facts.version, facts.image = old.get("version"), old.get("image")  # nothing changes
    facts.serving = observed.statefulset(version.major)
    facts.initialized = _initialized_before(db)
    facts.progressing = ("False", "NameCollision", collision.message)
    if collision.address:
        facts.endpoint = None
    if collision.address or observe.ready_replicas(facts.serving) < 1:
        facts.ready = ("False", "NameCollision", collision.message)
        facts.phase = "Failed"
    new, events, _ = status.compute(db, facts, observed, spec.replicas)
    kept = []
    if observed.secret is not None and is_ours(observed.secret, db):
        # its passwords (and the initialized database name) kept
        secret = workload.credentials_secret(initialized_name(db, spec, observed),
                                             passwords(observed.secret, new_password))
        if collision.address:
            secret["data"] = {k: v for k, v in secret["data"].items()
                              if k not in ("host", "uri")}
        kept.append(secret)
    # (the other Database's deletion runs only that one: look again now and then)
    return Plan(children=None, status=new, events=events, kept=kept,
                requeue_after=COLLISION_RECHECK)


@dataclass
class Step:
    """Where an upgrade stands: the version reported as serving, the one the serving
    StatefulSet is built with (ahead of it while a minor upgrade rolls), extra children."""

    serve: tuple[Version, str]
    build: tuple[Version, str]
    extra: list[Obj] = field(default_factory=list)


def _upgrade(spec: DatabaseSpec, observed: Observed, current: tuple[Version, str],
             facts: Facts) -> Step:
    version, image = current
    names = Names.of(spec.name)
    target = (spec.version, spec.image)
    old_sts = observed.statefulset(version.major)
    if spec.version.major == version.major:
        started = old_sts is None or observe.sts_image(old_sts) == spec.image
    else:
        started = observed.statefulset(spec.version.major) is not None or observed.job(
            names.upgrade_job(spec.version.major)) is not None
    if not started:
        pre = jobs.pre_upgrade_job(spec, (str(version), image))
        job = observed.job(pre["metadata"]["name"])
        state = observe.job_state(job)
        if state == FAILED:
            facts.progressing = (
                "False", "UpgradeBackupFailed",
                f"the backup before upgrading to {spec.version}, Job {pre['metadata']['name']}, "
                f"failed ({observe.job_failure(job or {})}); nothing was upgraded. Delete the "
                "Job to try again")
            return Step(current, current, [pre])
        if state != COMPLETE:
            facts.progressing = ("True", "BackingUp",
                                 f"backing up before upgrading {describe(version, image)} -> "
                                 f"{describe(spec.version, spec.image)}")
            return Step(current, current, [pre])
    if spec.version.major != version.major:
        return _major(spec, observed, current, target, facts)
    if old_sts is not None and observe.rolled_out(old_sts) and observe.sts_image(
            old_sts) == spec.image:
        facts.progressing = ("False", "Stable",
                             f"PostgreSQL {describe(spec.version, spec.image)} serves")
        return Step(target, target)
    facts.progressing = ("True", "RollingUpdate",
                         f"rolling the servers from {describe(version, image)} to "
                         f"{describe(spec.version, spec.image)}")
    return Step(current, target)


def _major(spec: DatabaseSpec, observed: Observed, current: tuple[Version, str],
           target: tuple[Version, str], facts: Facts) -> Step:
    version, _image = current
    names = Names.of(spec.name)
    new_major = spec.version.major
    new_sts = observed.statefulset(new_major)
    built = (str(target[0]), target[1])
    extra = [workload.statefulset(
        spec, (observe.version_label(new_sts, *target), target[1]), new_major,
        claim_template=observe.claim_template(new_sts))]
    job_name = names.upgrade_job(new_major)
    job = observed.job(job_name)
    if job is None and observe.ready_replicas(new_sts) < 1:
        facts.progressing = ("True", "StartingNewServer",
                             f"waiting for the PostgreSQL {spec.version} primary "
                             f"{names.primary(new_major)} to be ready")
        return Step(current, current, extra)
    extra.append(jobs.upgrade_job(spec, version.major, built))
    state = observe.job_state(job)
    if state == COMPLETE:
        facts.progressing = ("False", "Stable", f"PostgreSQL {spec.version} serves")
        facts.events.append((
            "Normal", "OldVolumesKept",
            f"the PostgreSQL {version.major} volumes (data-{names.statefulset(version.major)}-*)"
            " are kept as a way back; delete them when no longer needed, and then their"
            " PersistentVolumes, which eventop keeps Retain (annotation"
            " eventop.dev/reclaim-policy)"))
        return Step(target, target)
    if state == FAILED:
        facts.progressing = (
            "False", "UpgradeFailed",
            f"copying the data into PostgreSQL {spec.version} failed, Job {job_name} "
            f"({observe.job_failure(job or {})}); {version} still serves and accepts writes. "
            f"To try again, delete the Job: the copy starts over into an emptied "
            f"{names.statefulset(new_major)}")
    else:
        facts.progressing = ("True", "CopyingData",
                             f"copying every database from {version} into {spec.version}")
    return Step(current, current, extra)


def _initialization(db: Obj, spec: DatabaseSpec, observed: Observed,
                    version_image: tuple[str, str], facts: Facts) -> list[Obj]:
    """The init Job while it is needed; ``facts.initialized`` from it (or, once done, from
    the status: it runs once per Database)."""
    job = observed.job(Names.of(spec.name).init_job)
    before = _initialized_before(db)
    want = jobs.init_job(spec, version_image, int(version_image[0].split(".")[0]))
    same_image = job is not None and _job_image(job) == version_image[1]
    if before[0] == "True":
        facts.initialized = before
        return [want] if same_image else []
    stale = observed.stale_init_job
    if stale is not None:
        # A Job of an earlier Database of this name, orphaned (--cascade=orphan): its
        # completion says nothing of this Database's data.
        facts.initialized = ("False", "InitJobNotOurs",
                             f"Job {stale['metadata']['name']} is not this Database's (an "
                             "earlier Database of this name left it: orphaned by --cascade="
                             "orphan, or not collected yet): delete it to let this "
                             "Database's own init Job run")
        return []
    if job is None and observe.ready_replicas(facts.serving) < 1:
        facts.initialized = ("False", "WaitingForServer", "waiting for the primary to be ready")
        return []
    state = observe.job_state(job)
    if state == COMPLETE:
        facts.initialized = ("True", "Initialized",
                             f"role and database {spec.database_name} created")
    elif state == FAILED:
        facts.initialized = ("False", "InitFailed",
                             f"the init Job failed ({observe.job_failure(job or {})}); see its "
                             "logs, then delete the Job to run it again")
    else:
        facts.initialized = ("False", "Initializing", "the init Job is running")
    return [want] if job is None or same_image else []


def _job_image(job: Obj) -> str | None:
    containers = (((job.get("spec") or {}).get("template") or {}).get("spec") or {}).get(
        "containers") or []
    return containers[0].get("image") if containers else None
