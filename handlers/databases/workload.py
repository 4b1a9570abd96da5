"""The server side of a Database, as pure functions: credentials, configuration, Services,
the StatefulSet, and the backup volume.

Every object carries the ``app.kubernetes.io/*`` labels; the reconcile decides ownership
(the backup volume never has an owner, so the garbage collector can not take the backups).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from eventop.engine import PARENT_UID_LABEL
from eventop.handlers.databases import scripts
from eventop.handlers.databases.spec import DatabaseSpec, Names, quantity
from eventop.kube import label_value, standard_labels

Obj = dict[str, Any]

APP_NAME = "postgres"
MAJOR_LABEL = "eventop.dev/postgres-major"
VERSION_LABEL = "app.kubernetes.io/version"
POD_NAME_LABEL = "statefulset.kubernetes.io/pod-name"
SUPERUSER = "postgres"
POSTGRES_UID = 999  # the postgres user of the official (Debian-based) image
CONFIG_DIR = "/etc/eventop"
DATA_MOUNT = "/var/lib/postgresql/data"

# pg_hba.conf: the image's own rules (trust on the pod-local socket, passwords over the
# network) plus replication connections for the standbys. The image writes its rules into the
# data directory only at initdb; this file, mounted and named by hba_file, serves every
# version and every pod alike.
PG_HBA = """\
# TYPE  DATABASE     USER        ADDRESS   METHOD
local   all          all                   trust
host    all          all         all       scram-sha-256
host    replication  replicator  all       scram-sha-256
"""


@dataclass(frozen=True)
class Passwords:
    """The generated secrets of one Database: set once, then read back from its Secret."""

    app: str
    superuser: str
    replication: str

    KEYS = ("password", "superuser-password", "replication-password")

    @classmethod
    def from_secret(cls, secret: Obj | None) -> dict[str, str]:
        """The passwords a Secret already holds (decoded), by key; missing keys absent."""
        data = (secret or {}).get("data") or {}
        found = {}
        for key in cls.KEYS:
            if data.get(key):
                found[key] = base64.b64decode(data[key]).decode()
        return found

    def __repr__(self) -> str:  # never in a log line or a traceback
        return "Passwords(<hidden>)"


def labels(spec: DatabaseSpec, component: str) -> dict[str, str]:
    return standard_labels(APP_NAME, spec.name, component)


def server_selector(spec: DatabaseSpec, major: int) -> dict[str, str]:
    """The immutable selector of one major's StatefulSet (its pods only, not the other
    major's during an upgrade)."""
    return {
        "app.kubernetes.io/name": APP_NAME,
        "app.kubernetes.io/instance": label_value(spec.name),
        "app.kubernetes.io/component": "server",
        MAJOR_LABEL: str(major),
    }


def meta(spec: DatabaseSpec, name: str, component: str, **extra_labels: str) -> Obj:
    return {"name": name, "namespace": spec.namespace,
            "labels": {**labels(spec, component), **extra_labels}}


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def host(spec: DatabaseSpec) -> str:
    return f"{Names.of(spec.name).service}.{spec.namespace}.svc"


def endpoint(spec: DatabaseSpec) -> str:
    return f"{host(spec)}:{spec.port}"


def credentials_secret(spec: DatabaseSpec, passwords: Passwords) -> Obj:
    """What an application needs to connect, as the application role: ``username``,
    ``password``, ``database``, ``host``, ``port`` and a ready ``uri``. The superuser and
    replication passwords are here too, for the init, backup and upgrade Jobs."""
    uri = (f"postgresql://{spec.user}:{passwords.app}@{host(spec)}:{spec.port}/"
           f"{spec.database_name}")
    return {
        "apiVersion": "v1", "kind": "Secret",
        "metadata": meta(spec, Names.of(spec.name).secret, "credentials"),
        "type": "Opaque",
        "data": {key: _b64(value) for key, value in {
            "username": spec.user, "password": passwords.app, "database": spec.database_name,
            "host": host(spec), "port": str(spec.port), "uri": uri,
            "superuser-password": passwords.superuser,
            "replication-password": passwords.replication}.items()},
    }


def config_map(spec: DatabaseSpec) -> Obj:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": meta(spec, f"{Names.of(spec.name).base}-config", "server"),
            "data": {"pg_hba.conf": PG_HBA}}


def _service_port(spec: DatabaseSpec) -> Obj:
    return {"name": "postgres", "port": spec.port, "targetPort": "postgres",
            "protocol": "TCP"}


def headless_service(spec: DatabaseSpec) -> Obj:
    """The StatefulSets' governing Service: a DNS name per pod (``<pod>.<name>-hl``), which
    standbys, backups and upgrades use to reach one server. Not-ready pods are published so
    a standby can find its primary while both start."""
    names = Names.of(spec.name)
    selector = {k: v for k, v in server_selector(spec, 0).items() if k != MAJOR_LABEL}
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": meta(spec, names.headless, "server"),
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                 "selector": selector, "ports": [_service_port(spec)]},
    }


def client_service(spec: DatabaseSpec, major: int) -> Obj:
    """The address applications use: the primary (pod 0) of the major that serves. A major
    upgrade switches it to the new StatefulSet's primary once the data was copied."""
    names = Names.of(spec.name)
    selector = {**server_selector(spec, major), POD_NAME_LABEL: names.primary(major)}
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": meta(spec, names.service, "server"),
        "spec": {"type": "ClusterIP", "selector": selector, "ports": [_service_port(spec)]},
    }


def pod_security() -> Obj:
    """Pod Security Standard "restricted": non-root (the image's postgres user), no
    privilege escalation, no capabilities, RuntimeDefault seccomp."""
    return {"runAsNonRoot": True, "runAsUser": POSTGRES_UID, "runAsGroup": POSTGRES_UID,
            "fsGroup": POSTGRES_UID, "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"}}


def container_security() -> Obj:
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"}}


def secret_env(name: str, secret: str, key: str) -> Obj:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


def _probe(spec: DatabaseSpec, **timing: int) -> Obj:
    return {"exec": {"command": ["pg_isready", "-q", "-h", "127.0.0.1", "-p", str(spec.port),
                                 "-U", SUPERUSER, "-d", "postgres"]},
            "timeoutSeconds": 5, **timing}


def statefulset(spec: DatabaseSpec, version_image: tuple[str, str], major: int, *,
                claim_template: Obj | None = None) -> Obj:
    """One major's servers: pod 0 the primary, the others standbys copied from it.

    ``version_image`` is what this StatefulSet runs (an upgrade changes it only after its
    backup). ``claim_template`` is the data volume template of the existing StatefulSet:
    volumeClaimTemplates are immutable, so once created they are kept as they are.
    """
    names = Names.of(spec.name)
    version, image = version_image
    selector = server_selector(spec, major)
    pod_labels = {**labels(spec, "server"), MAJOR_LABEL: str(major), VERSION_LABEL: version}
    sts_name = names.statefulset(major)
    volume_mounts = [
        {"name": "data", "mountPath": DATA_MOUNT},
        {"name": "run", "mountPath": "/var/run/postgresql"},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    env = [
        {"name": "POSTGRES_USER", "value": SUPERUSER},
        secret_env("POSTGRES_PASSWORD", names.secret, "superuser-password"),
        {"name": "PGDATA", "value": scripts.PGDATA},
        {"name": "PGPORT", "value": str(spec.port)},
    ]
    server = {
        "name": "postgres", "image": image, "imagePullPolicy": "IfNotPresent",
        "args": ["postgres", "-c", f"hba_file={CONFIG_DIR}/pg_hba.conf"],
        "env": env,
        "ports": [{"name": "postgres", "containerPort": spec.port, "protocol": "TCP"}],
        # initdb or crash recovery of a large database may take long: liveness waits for it.
        "startupProbe": _probe(spec, periodSeconds=10, failureThreshold=90),
        "readinessProbe": _probe(spec, periodSeconds=10, failureThreshold=3),
        "livenessProbe": _probe(spec, periodSeconds=15, failureThreshold=6),
        "resources": spec.resources,
        "securityContext": container_security(),
        "volumeMounts": [*volume_mounts,
                         {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
                         {"name": "shm", "mountPath": "/dev/shm"}],
    }
    standby = {
        "name": "standby-copy", "image": image, "imagePullPolicy": "IfNotPresent",
        "command": ["bash", "-c", scripts.STANDBY],
        "env": [{"name": "PGDATA", "value": scripts.PGDATA},
                {"name": "PGPORT", "value": str(spec.port)},
                {"name": "PRIMARY_HOST", "value": names.primary_host(major)},
                secret_env("PGPASSWORD", names.secret, "replication-password")],
        "resources": spec.resources,
        "securityContext": container_security(),
        "volumeMounts": volume_mounts,
    }
    # The volumes outlive the StatefulSet; the Database's uid in their labels is what lets
    # its deletion policy delete exactly them (and no volume kept by an earlier Database).
    template = claim_template or {
        "metadata": {"name": "data", "labels": {**labels(spec, "server"),
                                                MAJOR_LABEL: str(major),
                                                PARENT_UID_LABEL: spec.uid}},
        "spec": {"accessModes": ["ReadWriteOnce"],
                 "resources": {"requests": {"storage": spec.storage_size}},
                 **({"storageClassName": spec.storage_class} if spec.storage_class else {})},
    }
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": meta(spec, sts_name, "server", **{MAJOR_LABEL: str(major),
                                                      VERSION_LABEL: version}),
        "spec": {
            "serviceName": names.headless,
            "replicas": spec.replicas,
            "podManagementPolicy": "OrderedReady",
            "updateStrategy": {"type": "RollingUpdate"},
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {
                    "enableServiceLinks": False,
                    "automountServiceAccountToken": False,
                    # postgres' "fast" shutdown on SIGTERM needs a moment for a checkpoint.
                    "terminationGracePeriodSeconds": 60,
                    "securityContext": pod_security(),
                    "initContainers": [standby],
                    "containers": [server],
                    "volumes": [
                        {"name": "run", "emptyDir": {}},
                        {"name": "tmp", "emptyDir": {}},
                        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "256Mi"}},
                        {"name": "config", "configMap": {
                            "name": f"{names.base}-config", "defaultMode": 0o444}},
                    ],
                },
            },
            "volumeClaimTemplates": [template],
        },
    }


def backup_pvc(spec: DatabaseSpec, existing: Obj | None = None) -> Obj:
    """The backup volume. Never owned by the Database: backups outlive it.

    ``existing`` is the claim as it is: once made, its class stays (immutable) and so does
    its size, unless ``spec.backup.storage.size`` asks for more (see
    :func:`backup_size`)."""
    have = (existing or {}).get("spec") or {}
    storage_class = have.get("storageClassName") if existing else spec.backup_class
    return {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": meta(spec, Names.of(spec.name).backup_pvc, "backup"),
        "spec": {"accessModes": ["ReadWriteOnce"],
                 "resources": {"requests": {"storage": backup_size(spec, existing)}},
                 **({"storageClassName": storage_class} if storage_class else {})},
    }


def backup_size(spec: DatabaseSpec, existing: Obj | None) -> str:
    """The backup volume's size: when it is made, ``spec.backup.storage.size`` or else
    ``spec.storage.size``; once it exists, its own size, grown only to an explicit
    ``spec.backup.storage.size`` above it. A claim never shrinks (the API server refuses
    it), and grows only where its class allows expansion: a changed ``storage.size``, which
    is about the data volumes, must not turn into a refused write of the backup volume."""
    current = ((((existing or {}).get("spec") or {}).get("resources") or {})
               .get("requests") or {}).get("storage")
    if current is None:
        return spec.backup_size or spec.storage_size
    field, reason = "spec.backup.storage.size", "InvalidStorage"
    if spec.backup_size is not None and quantity(spec.backup_size, field, reason) > quantity(
            current, field, reason):
        return spec.backup_size
    return str(current)
