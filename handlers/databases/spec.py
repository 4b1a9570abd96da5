"""A Database's spec, read once into a typed value; versions and the images they run.

The API server already refuses what the schema can say (an unknown engine, a missing storage
size, a malformed version); what it can not (an unsupported major, a cron schedule, a
reserved database name) is checked here and raised as the engine's
:class:`~eventop.engine.SpecError` (one model of an invalid custom resource for every
handler), which the handler reports in the status instead of acting.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from decimal import Decimal
from functools import total_ordering
from typing import Any

from kubernetes.utils import parse_quantity

from eventop.engine import SpecError
from eventop.handlers.databases.schedule import ScheduleError, normalize
from eventop.kube import dns_label

Obj = dict[str, Any]

API_VERSION = "eventop.dev/v1"
KIND = "Database"
FINALIZER = "eventop.dev/database-data"

IMAGE_REPOSITORY = "docker.io/library/postgres"
# The minor each supported major runs by default: the newest release when this operator
# version was made. A later operator version raising a pin rolls every Database on that
# major (a minor upgrade: backup first, then a rolling restart). 13 is past end of life.
PINNED_MINOR = {14: 20, 15: 15, 16: 11, 17: 7, 18: 1}

DEFAULT_RESOURCES: Obj = {"requests": {"cpu": "100m", "memory": "256Mi"},
                          "limits": {"memory": "1Gi"}}
DEFAULT_SCHEDULE = "0 0 * * *"
DELETION_POLICIES = ("Snapshot", "Retain", "Delete")

# Longest part of the Database name kept in object names: the StatefulSet "<base>-pg<NN>"
# must stay within 52 characters (its pods' controller-revision-hash label adds 11 to a
# 63-character label value), and the CronJob "<base>-backup" within 52 too.
MAX_NAME_PART = 40


@total_ordering
@dataclass(frozen=True)
class Version:
    """A PostgreSQL version: a major and, when known, a minor."""

    major: int
    minor: int | None = None

    @classmethod
    def parse(cls, text: str) -> Version:
        match = re.fullmatch(r"([0-9]{1,3})(?:\.([0-9]{1,3}))?", str(text).strip())
        if not match:
            raise SpecError(f"version {text!r} is not MAJOR or MAJOR.MINOR (e.g. \"16\" or "
                            "\"16.11\")", reason="InvalidVersion")
        return cls(int(match[1]), int(match[2]) if match[2] is not None else None)

    def __str__(self) -> str:
        return f"{self.major}" if self.minor is None else f"{self.major}.{self.minor}"

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Version):
            return NotImplemented
        return (self.major, self.minor or 0) < (other.major, other.minor or 0)

    @property
    def slug(self) -> str:
        """The version in an object name or label value: ``16-11``."""
        return str(self).replace(".", "-")


@dataclass(frozen=True)
class DatabaseSpec:
    name: str
    namespace: str
    uid: str
    version: Version  # resolved: the pinned minor filled in unless an image overrides it
    image: str
    replicas: int
    port: int
    database_name: str
    storage_size: str
    storage_class: str | None
    resources: Obj
    schedule: str  # as written by the user
    retention: int
    backup_size: str | None  # spec.backup.storage.size; None: the default (storage_size)
    backup_class: str | None
    snapshot_class: str | None
    deletion_policy: str

    @property
    def user(self) -> str:
        """The application role: owner of the application database."""
        return self.database_name


#: An official-image style tag that names a version: ``17``, ``17.7``, ``17.7-alpine``,
#: ``16-bookworm`` (the major, the minor, then a variant).
_VERSION_TAG = re.compile(r"([0-9]{1,3})(?:\.([0-9]{1,3}))?(?:-[A-Za-z0-9][A-Za-z0-9._-]*)?")


def image_version(image: str) -> Version | None:
    """The PostgreSQL version an image's tag names, for an image of a repository named
    ``postgres`` (``postgres:17.7-alpine``, ``registry.example/mirror/postgres:16``); None
    when the tag names none (``latest``, no tag, only a digest) or the repository is another
    one (its tags are its own: ``postgis/postgis:16-3.4`` is not read).

    Why: the image decides which binaries open the data directory. Trusting
    ``spec.version`` alone reported a version that did not run, and let a v16 Database roll
    onto 17 binaries (which can not open a 16 data directory)."""
    name = image.split("@", 1)[0]
    repository, _, tag = name.rpartition(":")
    if not repository or "/" in tag:  # no tag (the colon was a registry port's)
        return None
    if repository.rsplit("/", 1)[-1] != "postgres":
        return None
    match = _VERSION_TAG.fullmatch(tag)
    if not match:
        return None
    return Version(int(match[1]), int(match[2]) if match[2] is not None else None)


def describe(version: Version | str, image: str | None) -> str:
    """A version for a message: ``17.7``; with ``(image X)`` when an image whose tag names no
    version runs (``latest``, a digest): its version is only what spec.version says."""
    if image and image != image_for(Version.parse(str(version))) \
            and image_version(image) is None:
        return f"{version} (image {image})"
    return str(version)


def resolve(version: Version, image: str | None) -> tuple[Version, str]:
    """(version that runs, image). Raises SpecError for a major eventop does not support,
    for an image whose tag names another major than ``spec.version`` (its binaries could
    not open the data directory), and for one whose tag names another minor than a
    ``spec.version`` that names one (``17.9`` with ``postgres:17.7``: the spec says two
    things, and reporting either one would be wrong about the other; before, the image ran
    and the status said "17.7, as spec.version asks", or a Database an earlier release
    reported as 17.9 was refused as a downgrade to 17.7 that it could never leave). An image
    whose tag names a minor runs that version (status.version reports it); one whose tag
    names only a major, or none, runs what ``spec.version`` says (trusted as written: the
    tag says no more, and an earlier release reported that too)."""
    if version.major not in PINNED_MINOR:
        supported = ", ".join(str(m) for m in sorted(PINNED_MINOR))
        raise SpecError(f"PostgreSQL {version.major} is not supported; choose one of "
                        f"{supported}", reason="UnsupportedVersion")
    if image:
        tagged = image_version(image)
        if tagged is None:
            return version, image
        if tagged.major != version.major:
            raise SpecError(f"spec.image {image!r} runs PostgreSQL {tagged} but spec.version "
                            f"is {version}: the major versions must be the same (set "
                            f"spec.version to {tagged.major} to upgrade, or use a "
                            f"PostgreSQL {version.major} image)",
                            reason="ImageVersionMismatch")
        if tagged.minor is None:
            return version, image
        if version.minor is not None and version.minor != tagged.minor:
            raise SpecError(f"spec.image {image!r} runs PostgreSQL {tagged} but spec.version "
                            f"is {version}: the two contradict each other (set spec.version "
                            f"to {tagged} or {tagged.major}, or use a PostgreSQL {version} "
                            "image)", reason="ImageVersionMismatch")
        return tagged, image
    if version.minor is None:
        version = Version(version.major, PINNED_MINOR[version.major])
    return version, f"{IMAGE_REPOSITORY}:{version}"


def image_for(version: Version) -> str:
    """The default image of a version already running (status.version)."""
    return f"{IMAGE_REPOSITORY}:{version}"


#: Names the application's database and role must not take: the server's superuser and
#: the replication role (the init Job would make them the application's, without superuser
#: or replication), the template databases, and what PostgreSQL itself refuses as a role.
RESERVED_NAMES = frozenset({"postgres", "replicator", "template0", "template1", "public",
                            "none", "current_user", "session_user", "current_role"})


def reserved(name: str) -> bool:
    return name in RESERVED_NAMES or name.startswith("pg_")


def default_database_name(name: str) -> str:
    cleaned = re.sub(r"[^a-z0-9_]", "_", name.lower())[:63]
    if not re.match(r"[a-z_]", cleaned) or reserved(cleaned):
        return f"db_{cleaned}"[:63]
    return cleaned


def database_name(db_name: str, given: str | None) -> str:
    """``spec.databaseName`` (also the application's role), refused if reserved, or one
    made from the Database's name."""
    if not given:
        return default_database_name(db_name)
    if reserved(given):
        raise SpecError(f"spec.databaseName {given!r} is reserved (the server's superuser, "
                        "the replication role, a template database, or a name PostgreSQL "
                        "keeps for itself): choose another, or leave it out to use the "
                        "Database's name", reason="InvalidDatabaseName")
    return given


def parse_spec(db: Obj) -> DatabaseSpec:
    """The spec as values, defaults filled in (the API server fills most already: objects
    written before a default existed, or by a server without defaulting, get them here)."""
    meta = db.get("metadata") or {}
    spec = db.get("spec") or {}
    if spec.get("engine", "postgres") != "postgres":
        raise SpecError(f"engine {spec.get('engine')!r} is not supported; use postgres",
                        reason="UnsupportedEngine")
    if "version" not in spec:
        raise SpecError("spec.version is required (e.g. \"16\")", reason="InvalidVersion")
    version, image = resolve(Version.parse(spec["version"]), spec.get("image"))
    storage = spec.get("storage") or {}
    if not storage.get("size"):
        raise SpecError("spec.storage.size is required (e.g. 10Gi)", reason="InvalidStorage")
    size(storage["size"], "spec.storage.size")
    check_resources(spec.get("resources") or {})
    backup = spec.get("backup") or {}
    schedule = str(backup.get("schedule") or DEFAULT_SCHEDULE)
    try:
        normalize(schedule)
    except ScheduleError as exc:
        raise SpecError(f"spec.backup.{exc}", reason="InvalidSchedule") from exc
    backup_storage = backup.get("storage") or {}
    if backup_storage.get("size"):
        size(backup_storage["size"], "spec.backup.storage.size")
    policy = spec.get("deletionPolicy", "Snapshot")
    if policy not in DELETION_POLICIES:
        raise SpecError(f"deletionPolicy {policy!r}: use one of "
                        f"{', '.join(DELETION_POLICIES)}", reason="InvalidDeletionPolicy")
    return DatabaseSpec(
        name=meta["name"], namespace=meta.get("namespace") or "default",
        uid=str(meta.get("uid") or ""),
        version=version, image=image,
        replicas=int(spec.get("replicas", 1)), port=int(spec.get("port", 5432)),
        database_name=database_name(meta["name"], spec.get("databaseName")),
        storage_size=str(storage["size"]), storage_class=storage.get("storageClassName"),
        resources=spec.get("resources") or DEFAULT_RESOURCES,
        schedule=schedule, retention=int(backup.get("retention", 7)),
        backup_size=str(backup_storage["size"]) if backup_storage.get("size") else None,
        backup_class=backup_storage.get("storageClassName"),
        snapshot_class=spec.get("snapshotClassName"), deletion_policy=policy,
    )


@dataclass(frozen=True)
class Names:
    """The names of a Database's objects, all in its namespace."""

    base: str

    @classmethod
    def of(cls, db_name: str) -> Names:
        return cls(dns_label(db_name, MAX_NAME_PART))

    @property
    def secret(self) -> str:
        return f"{self.base}-credentials"

    @property
    def service(self) -> str:
        return self.base

    @property
    def headless(self) -> str:
        return f"{self.base}-hl"

    def statefulset(self, major: int) -> str:
        """One StatefulSet per major: a data directory belongs to one major version."""
        return f"{self.base}-pg{major}"

    def primary(self, major: int) -> str:
        return f"{self.statefulset(major)}-0"

    def primary_host(self, major: int) -> str:
        return f"{self.primary(major)}.{self.headless}"

    @property
    def backup_pvc(self) -> str:
        return f"{self.base}-backups"

    @property
    def init_job(self) -> str:
        return f"{self.base}-init"

    @property
    def backup_cronjob(self) -> str:
        return f"{self.base}-backup"

    def pre_upgrade_job(self, target: Version, image: str) -> str:
        """One backup per upgrade target: its version and (hashed) image."""
        digest = hashlib.sha256(image.encode()).hexdigest()[:5]
        return f"{self.base}-backup-{target.slug}-{digest}"

    def upgrade_job(self, major: int) -> str:
        return f"{self.base}-upgrade-pg{major}"

    @property
    def final_backup_job(self) -> str:
        return f"{self.base}-final-backup"

    def snapshot(self, pvc_name: str, db_uid: str) -> str:
        """Per data volume and per Database incarnation: a Database deleted, created again
        under the same name and deleted again keeps both generations of snapshots."""
        return f"{pvc_name}-{db_uid[:8]}"


def quantity(value: Any, field: str, reason: str) -> Decimal:
    """A Kubernetes quantity (``10Gi``, ``500m``), parsed by the official client; the API
    server would refuse the StatefulSet (or its pods) over anything else, out of sight."""
    try:
        return Decimal(parse_quantity(value))
    except (ValueError, TypeError, ArithmeticError):
        raise SpecError(f"{field} {value!r} is not a Kubernetes quantity (such as 10Gi or "
                        "500m)", reason=reason) from None


def size(value: Any, field: str) -> Decimal:
    """A volume size: a quantity above zero (the API server refuses a claim of 0)."""
    amount = quantity(value, field, "InvalidStorage")
    if amount <= 0:
        raise SpecError(f"{field} {value!r} must be more than zero", reason="InvalidStorage")
    return amount


def check_resources(resources: Any) -> None:
    """Requests and limits are quantities, and no request is above its limit (else every
    pod of the StatefulSet is refused, which only the StatefulSet's Events would say)."""
    if not isinstance(resources, dict):
        raise SpecError("spec.resources must map requests and limits", reason="InvalidResources")
    parsed: dict[str, dict[str, Decimal]] = {}
    for part in ("requests", "limits"):
        values = resources.get(part) or {}
        if not isinstance(values, dict):
            raise SpecError(f"spec.resources.{part} must map resource names to quantities",
                            reason="InvalidResources")
        parsed[part] = {name: quantity(value, f"spec.resources.{part}.{name}",
                                       "InvalidResources") for name, value in values.items()}
    for name, request in parsed["requests"].items():
        limit = parsed["limits"].get(name)
        if limit is not None and request > limit:
            raise SpecError(f"spec.resources.requests.{name} "
                            f"{resources['requests'][name]!r} is above its limit "
                            f"{resources['limits'][name]!r}", reason="InvalidResources")
