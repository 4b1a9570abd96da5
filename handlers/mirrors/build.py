"""The desired objects of one RegistryMirror, as pure functions of its dict.

A mirror becomes exactly five objects, all owned by it (the garbage collector removes them
with it) and labelled with the standard ``app.kubernetes.io/*`` labels:

* ``PersistentVolumeClaim`` ``mirror-<n>-cache``: the blob cache;
* ``Service`` ``mirror-<n>-hl`` (headless): the StatefulSet's governing Service, also the
  per-pod target for Prometheus (port ``metrics``);
* ``Service`` ``mirror-<n>`` (ClusterIP): the stable in-cluster address of the registry;
* ``StatefulSet`` ``mirror-<n>``: one CNCF distribution registry in pull-through-cache mode,
  configured only through ``REGISTRY_*`` environment variables (the image's own config file
  stays untouched, so an image bump never fights a mounted config);
* ``DaemonSet`` ``mirror-<n>-node``: the kube-registry-proxy pattern, an nginx TCP proxy on
  every node listening on ``hostPort`` and forwarding to the ClusterIP Service, so container
  runtimes can pull from ``localhost:<hostPort>`` (which they treat as a plain-HTTP registry).

Nothing here reads or decides: :mod:`.spec` says what the mirror asks for, :mod:`.desired`
decides *whether* the objects are wanted and feeds in what it read (the PVC size to keep,
a hash of the credentials the registry reads).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eventop.handlers.mirrors.spec import MirrorSpec, parse_spec
from eventop.kube import dns_label, owner_reference, standard_labels
from eventop.kube import label_value as kube_label_value

Obj = dict[str, Any]

APP_NAME = "registry-mirror"

PROXY_UID = 101
REGISTRY_UID = 1000

REGISTRY_PORT = 5000
DEBUG_PORT = 5001
METRICS_PATH = "/metrics"
# The node proxy listens on a fixed unprivileged port inside its pod; the node's
# ``hostPort`` is mapped onto it by the CNI portmap plugin. So any hostPort (even < 1024)
# works without root or NET_BIND_SERVICE, and the nginx config does not depend on it.
PROXY_PORT = 8080
STORAGE_ROOT = "/var/lib/registry"
CACHE_VOLUME = "cache"

# Longest sanitised mirror name kept in object names. The tightest limit is the
# StatefulSet: its pods carry ``controller-revision-hash=<sts name>-<10 chars>`` (a label
# value, max 63), so the StatefulSet name must stay within 52; "mirror-" + 40 = 47.
MAX_NAME_PART = 40

#: The keys of the credentials Secret the registry reads (its upstream login).
CREDENTIAL_KEYS = ("username", "password")


# -- names and labels ---------------------------------------------------------------


def name_part(mirror_name: str) -> str:
    """The mirror's name as a DNS-1035 fragment of at most :data:`MAX_NAME_PART` chars.

    A RegistryMirror name is a DNS subdomain (dots allowed, up to 253 chars) but Service
    names must be DNS-1035 labels. Names that already fit are used as they are; any other
    gets a hash of the original appended, so ``a.b`` and ``a-b`` never share objects. (The
    names are in existing objects: this form must not change.)
    """
    return dns_label(mirror_name, MAX_NAME_PART, fallback="m", fragment=True)


def label_value(value: str) -> str:
    """``value`` if it is a valid label value (<= 63 chars), else a shortened, hashed form.

    This form (55 characters and 6 of hash) is in the immutable selectors of existing
    workloads, so it must not change.
    """
    return kube_label_value(value, prefix_chars=55, hash_chars=6)


@dataclass(frozen=True)
class Names:
    """The names of a mirror's objects (all in the mirror's namespace)."""

    base: str

    @classmethod
    def of(cls, mirror_name: str) -> Names:
        return cls(f"mirror-{name_part(mirror_name)}")

    @property
    def pvc(self) -> str:
        return f"{self.base}-cache"

    @property
    def headless_service(self) -> str:
        return f"{self.base}-hl"

    @property
    def service(self) -> str:
        return self.base

    @property
    def statefulset(self) -> str:
        return self.base

    @property
    def daemonset(self) -> str:
        return f"{self.base}-node"


def selector_labels(mirror: Obj, component: str) -> dict[str, str]:
    """The immutable selector of a workload: name, instance and component only."""
    return {
        "app.kubernetes.io/name": APP_NAME,
        "app.kubernetes.io/instance": label_value(mirror["metadata"]["name"]),
        "app.kubernetes.io/component": component,
    }


def labels(mirror: Obj, component: str) -> dict[str, str]:
    return standard_labels(APP_NAME, label_value(mirror["metadata"]["name"]), component)


def _meta(mirror: Obj, name: str, component: str) -> Obj:
    return {
        "name": name,
        "namespace": mirror["metadata"]["namespace"],
        "labels": labels(mirror, component),
        "ownerReferences": [owner_reference(mirror)],
    }


# -- the objects --------------------------------------------------------------------------


def pvc(mirror: Obj, spec: MirrorSpec, *, size: str | None = None,
        storage_class: str | None = None) -> Obj:
    """The cache claim. ``size``/``storage_class`` override the spec (to keep what exists:
    a claim never shrinks and its class is immutable); ``storage_class=""`` keeps a claim
    without a class."""
    names = Names.of(mirror["metadata"]["name"])
    body: Obj = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": size or spec.size}},
    }
    cls = storage_class if storage_class is not None else spec.storage_class
    if cls:
        body["storageClassName"] = cls
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": _meta(mirror, names.pvc, "cache"), "spec": body}


def headless_service(mirror: Obj) -> Obj:
    names = Names.of(mirror["metadata"]["name"])
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": _meta(mirror, names.headless_service, "registry"),
        "spec": {
            "clusterIP": "None",
            "selector": selector_labels(mirror, "registry"),
            "ports": [
                {"name": "http", "port": REGISTRY_PORT, "targetPort": "http", "protocol": "TCP"},
                {"name": "metrics", "port": DEBUG_PORT, "targetPort": "metrics",
                 "protocol": "TCP"},
            ],
        },
    }


def service(mirror: Obj) -> Obj:
    names = Names.of(mirror["metadata"]["name"])
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": _meta(mirror, names.service, "registry"),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(mirror, "registry"),
            "ports": [{"name": "http", "port": REGISTRY_PORT, "targetPort": "http",
                       "protocol": "TCP"}],
        },
    }


def service_url(mirror: Obj) -> str:
    """The registry's in-cluster URL, for the status (what a person or a pod would use)."""
    names = Names.of(mirror["metadata"]["name"])
    return (f"http://{names.service}.{mirror['metadata']['namespace']}.svc.cluster.local:"
            f"{REGISTRY_PORT}")


def registry_env(spec: MirrorSpec) -> list[Obj]:
    """The registry's configuration, as the ``REGISTRY_*`` overrides distribution reads.

    Each name is the upper-cased path of a key in distribution's config.yml
    (``proxy.remoteurl`` -> ``REGISTRY_PROXY_REMOTEURL``).
    """
    env: list[Obj] = [
        {"name": "REGISTRY_HTTP_ADDR", "value": f":{REGISTRY_PORT}"},
        {"name": "REGISTRY_PROXY_REMOTEURL", "value": spec.upstream},
        # "0s", not "0": a bare 0 reaches the config parser as a YAML integer, which not
        # every YAML library turns into a time.Duration; "0s" is a duration string to all.
        {"name": "REGISTRY_PROXY_TTL", "value": spec.ttl if spec.expiry_enabled else "0s"},
        {"name": "REGISTRY_STORAGE_FILESYSTEM_ROOTDIRECTORY", "value": STORAGE_ROOT},
        # The proxy's scheduler removes expired blobs and manifests; enabled whenever
        # entries expire at all.
        {"name": "REGISTRY_STORAGE_DELETE_ENABLED",
         "value": "true" if spec.expiry_enabled else "false"},
        {"name": "REGISTRY_HTTP_DEBUG_ADDR", "value": f":{DEBUG_PORT}"},
        {"name": "REGISTRY_HTTP_DEBUG_PROMETHEUS_ENABLED", "value": "true"},
        {"name": "REGISTRY_HTTP_DEBUG_PROMETHEUS_PATH", "value": METRICS_PATH},
        {"name": "REGISTRY_LOG_LEVEL", "value": "info"},
    ]
    if spec.credentials_secret:
        for key in CREDENTIAL_KEYS:
            env.append({"name": f"REGISTRY_PROXY_{key.upper()}", "valueFrom": {
                "secretKeyRef": {"name": spec.credentials_secret, "key": key}}})
    return env


def _pod_security(uid: int) -> Obj:
    return {
        "runAsNonRoot": True, "runAsUser": uid, "runAsGroup": uid, "fsGroup": uid,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _container_security() -> Obj:
    return {
        "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
        "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def statefulset(mirror: Obj, spec: MirrorSpec, *, credentials_version: str | None = None) -> Obj:
    """The registry. ``credentials_version`` (a hash of the credentials it reads from the
    Secret, see ``desired.credentials_digest``) goes into a pod annotation so that rotated
    credentials roll the pod: env from a Secret is read only at container start."""
    names = Names.of(mirror["metadata"]["name"])
    template_annotations = {
        "prometheus.io/scrape": "true", "prometheus.io/port": str(DEBUG_PORT),
        "prometheus.io/path": METRICS_PATH,
    }
    if spec.credentials_secret and credentials_version:
        template_annotations["eventop.dev/credentials-version"] = credentials_version
    probe_get = {"path": "/v2/", "port": "http", "scheme": "HTTP"}
    container: Obj = {
        "name": "registry",
        "image": spec.registry_image,
        "imagePullPolicy": "IfNotPresent",
        "env": registry_env(spec),
        "ports": [
            {"name": "http", "containerPort": REGISTRY_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": DEBUG_PORT, "protocol": "TCP"},
        ],
        # GET /v2/ answers 200 as long as no local auth is configured (upstream
        # credentials are used only towards the upstream), and distribution wraps its
        # handler in its health checks, so it turns 503 when the storage check fails.
        "readinessProbe": {"httpGet": probe_get, "periodSeconds": 10, "timeoutSeconds": 3,
                           "failureThreshold": 3},
        "livenessProbe": {"httpGet": probe_get, "initialDelaySeconds": 10, "periodSeconds": 20,
                          "timeoutSeconds": 5, "failureThreshold": 6},
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"},
                      "limits": {"cpu": "1", "memory": "512Mi"}},
        "securityContext": _container_security(),
        "volumeMounts": [{"name": CACHE_VOLUME, "mountPath": STORAGE_ROOT},
                         {"name": "tmp", "mountPath": "/tmp"}],
    }
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": _meta(mirror, names.statefulset, "registry"),
        "spec": {
            "replicas": 1,
            "serviceName": names.headless_service,
            # With the default OrderedReady, a pod that never gets Ready (say, a typo in
            # the upstream) blocks the rolling update that would fix it until someone
            # deletes the pod by hand; with one replica, Parallel costs nothing. Immutable
            # after creation, like serviceName and selector.
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": selector_labels(mirror, "registry")},
            "updateStrategy": {"type": "RollingUpdate"},
            "template": {
                "metadata": {"labels": labels(mirror, "registry"),
                             "annotations": template_annotations},
                "spec": {
                    # Service links would inject FOO_PORT=tcp://... variables; a Service
                    # called "registry" in the namespace yields REGISTRY_PORT, which the
                    # registry then parses as configuration and fails on.
                    "enableServiceLinks": False,
                    "automountServiceAccountToken": False,
                    "securityContext": _pod_security(REGISTRY_UID),
                    "terminationGracePeriodSeconds": 30,
                    "containers": [container],
                    "volumes": [
                        {"name": CACHE_VOLUME,
                         "persistentVolumeClaim": {"claimName": names.pvc}},
                        {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
                    ],
                },
            },
        },
    }


#: Filled in by :data:`PROXY_START` from the pod's ``/etc/resolv.conf``.
RESOLVER_SLOT, SEARCH_SLOT = "@RESOLVER@", "@SEARCH@"

#: The node proxy's start: the cluster's DNS server and the pod's own domain
#: (``<namespace>.svc.<cluster domain>``, the first search entry kubelet writes) put into
#: the config, which travels in ``NGINX_CONF``. No cluster domain is assumed.
PROXY_START = f"""\
set -eu
conf=${{RESOLV_CONF:-/etc/resolv.conf}}
resolver=$(awk '$1 == "nameserver" {{print $2; exit}}' "$conf")
search=$(awk '$1 == "search" {{print $2; exit}}' "$conf")
if [ -z "$resolver" ] || [ -z "$search" ]; then
  echo "$conf has no nameserver or no search line: cannot resolve the registry" >&2; exit 1
fi
case "$resolver" in *:*) resolver="[$resolver]" ;; esac
printf '%s' "$NGINX_CONF" | sed -e "s/{RESOLVER_SLOT}/$resolver/" -e "s/{SEARCH_SLOT}/$search/" \
  > /tmp/nginx.conf
exec nginx -c /tmp/nginx.conf -g 'daemon off;'
"""


def nginx_config(mirror: Obj) -> str:
    """A TCP (stream) proxy: protocol-agnostic, no buffering of multi-GB blobs on the node.

    The registry's Service is named through a variable, which nginx resolves when a
    connection needs it (at most every 10 s, the answer's ``valid``), not once at start:
    a Service deleted and made again gets a new ClusterIP, and proxies that resolved the
    name once would send every pull to the old one until restarted. A variable needs the
    full name (nginx's resolver knows no search path) and a ``resolver``: both come from
    the pod's ``/etc/resolv.conf`` at start (:data:`PROXY_START`)."""
    service = Names.of(mirror["metadata"]["name"]).service
    return "\n".join([
        "worker_processes 1;",
        "pid /tmp/nginx.pid;",
        "error_log /dev/stderr warn;",
        "events { worker_connections 1024; }",
        "stream {",
        f"  resolver {RESOLVER_SLOT} valid=10s;",
        "  resolver_timeout 5s;",
        "  server {",
        f"    listen {PROXY_PORT};",
        f"    set $registry {service}.{SEARCH_SLOT}:{REGISTRY_PORT};",
        "    proxy_pass $registry;",
        "    proxy_connect_timeout 5s;",
        "    proxy_timeout 10m;",
        "  }",
        "}",
        "",
    ])


def daemonset(mirror: Obj, spec: MirrorSpec) -> Obj:
    """The per-node proxy: ``localhost:<hostPort>`` on every node -> the ClusterIP Service.

    The nginx config travels in an environment variable and is written to the ``/tmp``
    emptyDir at start (with the pod's DNS server and domain, :data:`PROXY_START`), so the
    mirror needs no ConfigMap and a config change rolls the pods.
    ``spec.image.proxy`` must therefore be an nginx image with a shell and the stream module.
    """
    names = Names.of(mirror["metadata"]["name"])
    container: Obj = {
        "name": "proxy",
        "image": spec.proxy_image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["/bin/sh", "-c", PROXY_START],
        "env": [{"name": "NGINX_CONF", "value": nginx_config(mirror)}],
        "ports": [{"name": "registry", "containerPort": PROXY_PORT,
                   "hostPort": spec.host_port, "protocol": "TCP"}],
        # Ready only when the registry answers through this node's proxy: that is what
        # the mirror's Ready condition promises. Liveness checks the proxy alone, so a
        # registry restart does not restart every node proxy.
        "readinessProbe": {"httpGet": {"path": "/v2/", "port": "registry", "scheme": "HTTP"},
                           "periodSeconds": 10, "timeoutSeconds": 3, "failureThreshold": 3},
        "livenessProbe": {"tcpSocket": {"port": "registry"}, "initialDelaySeconds": 5,
                          "periodSeconds": 20, "failureThreshold": 3},
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"},
                      "limits": {"cpu": "500m", "memory": "64Mi"}},
        "securityContext": _container_security(),
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"},
                         {"name": "nginx-cache", "mountPath": "/var/cache/nginx"}],
    }
    return {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": _meta(mirror, names.daemonset, "node-proxy"),
        "spec": {
            "selector": {"matchLabels": selector_labels(mirror, "node-proxy")},
            "updateStrategy": {"type": "RollingUpdate",
                               "rollingUpdate": {"maxUnavailable": 1}},
            "template": {
                "metadata": {"labels": labels(mirror, "node-proxy")},
                "spec": {
                    "enableServiceLinks": False,
                    "automountServiceAccountToken": False,
                    "securityContext": _pod_security(PROXY_UID),
                    # Every node pulls images, control-plane and tainted ones included.
                    "tolerations": [{"operator": "Exists"}],
                    "terminationGracePeriodSeconds": 10,
                    "containers": [container],
                    "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "16Mi"}},
                                {"name": "nginx-cache", "emptyDir": {"sizeLimit": "16Mi"}}],
                },
            },
        },
    }


def desired_objects(mirror: Obj, spec: MirrorSpec | None = None, *,
                    pvc_size: str | None = None, storage_class: str | None = None,
                    credentials_version: str | None = None) -> list[Obj]:
    """All five objects, in the order they are applied (Services before the proxy that
    resolves them at start, the claim before the pod that mounts it)."""
    spec = spec or parse_spec(mirror)
    return [
        pvc(mirror, spec, size=pvc_size, storage_class=storage_class),
        headless_service(mirror),
        service(mirror),
        statefulset(mirror, spec, credentials_version=credentials_version),
        daemonset(mirror, spec),
    ]
