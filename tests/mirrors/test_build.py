"""The objects a RegistryMirror becomes: valid for the API server, and consistent with each
other in the ways a schema does not check (selectors, ports, probes, names, configuration)."""

from __future__ import annotations

import re
from typing import Any

import kubernetes_validate
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventop.handlers.mirrors import build
from eventop.handlers.mirrors.build import Names
from eventop.handlers.mirrors.spec import validate_upstream
from eventop.kube import selector_matches
from tests.mirrors.support import container, env_of

Obj = dict[str, Any]

# Keys of distribution's configuration (docs/content/about/configuration.md, v3.0) that
# this handler may set, as the REGISTRY_* variables its env override reads: the upper-cased
# path of the key, "_" between levels.
DISTRIBUTION_ENV = {
    "REGISTRY_LOG_LEVEL", "REGISTRY_LOG_FORMATTER", "REGISTRY_LOG_ACCESSLOG_DISABLED",
    "REGISTRY_HTTP_ADDR", "REGISTRY_HTTP_NET", "REGISTRY_HTTP_PREFIX", "REGISTRY_HTTP_HOST",
    "REGISTRY_HTTP_SECRET", "REGISTRY_HTTP_RELATIVEURLS", "REGISTRY_HTTP_DRAINTIMEOUT",
    "REGISTRY_HTTP_DEBUG_ADDR", "REGISTRY_HTTP_DEBUG_PROMETHEUS_ENABLED",
    "REGISTRY_HTTP_DEBUG_PROMETHEUS_PATH",
    "REGISTRY_STORAGE_FILESYSTEM_ROOTDIRECTORY", "REGISTRY_STORAGE_FILESYSTEM_MAXTHREADS",
    "REGISTRY_STORAGE_DELETE_ENABLED", "REGISTRY_STORAGE_REDIRECT_DISABLE",
    "REGISTRY_STORAGE_CACHE_BLOBDESCRIPTOR",
    "REGISTRY_STORAGE_MAINTENANCE_UPLOADPURGING_ENABLED",
    "REGISTRY_PROXY_REMOTEURL", "REGISTRY_PROXY_USERNAME", "REGISTRY_PROXY_PASSWORD",
    "REGISTRY_PROXY_TTL",
    "REGISTRY_HEALTH_STORAGEDRIVER_ENABLED", "REGISTRY_HEALTH_STORAGEDRIVER_INTERVAL",
}

DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def mirror(name: str = "docker-hub", **spec: Any) -> Obj:
    spec.setdefault("upstream", "https://registry-1.docker.io")
    return {
        "apiVersion": "eventop.dev/v1", "kind": "RegistryMirror",
        "metadata": {"name": name, "namespace": "registry-mirrors", "generation": 1,
                     "uid": "c197dc9c-3614-4d37-b271-24d676e76009",
                     "creationTimestamp": "2026-11-21T07:42:44Z"},
        "spec": spec,
    }


MIRRORS = {
    "docker-hub": mirror(hostPort=5001, storage={"size": "20Gi"}),
    "quay-with-class": mirror("quay", upstream="https://quay.io", hostPort=5002,
                              storage={"size": "20Gi", "storageClassName": "standard"}),
    "internal-with-credentials": mirror(
        "internal", upstream="https://registry.internal.example.com:8443", hostPort=80,
        credentialsSecretRef={"name": "internal-registry-credentials"}, ttl="0"),
    "defaults-only": mirror("gcr", upstream="https://gcr.io"),
    "long-dotted-name": mirror("team." + "x" * 80 + ".mirror", hostPort=6000),
}


def by_kind(objs: list[Obj]) -> dict[str, list[Obj]]:
    out: dict[str, list[Obj]] = {}
    for obj in objs:
        out.setdefault(obj["kind"], []).append(obj)
    return out


def parts(m: Obj) -> tuple[Obj, Obj, Obj, Obj, Obj]:
    objs = build.desired_objects(m, credentials_version="42")
    kinds = by_kind(objs)
    services = {s["metadata"]["name"]: s for s in kinds["Service"]}
    names = Names.of(m["metadata"]["name"])
    return (kinds["PersistentVolumeClaim"][0], services[names.headless_service],
            services[names.service], kinds["StatefulSet"][0], kinds["DaemonSet"][0])


@pytest.fixture(params=sorted(MIRRORS), ids=str)
def any_mirror(request: pytest.FixtureRequest) -> Obj:
    return MIRRORS[request.param]


# -- schema ------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["1.25", "1.28"])
def test_every_object_passes_the_kubernetes_api_schema(any_mirror: Obj, version: str) -> None:
    objs = build.desired_objects(any_mirror, credentials_version="1")
    assert [o["kind"] for o in objs] == ["PersistentVolumeClaim", "Service", "Service",
                                         "StatefulSet", "DaemonSet"]
    for obj in objs:
        kubernetes_validate.validate(obj, version, strict=True)


def test_schema_validation_catches_a_broken_object() -> None:
    sts = build.desired_objects(MIRRORS["docker-hub"])[3]
    container(sts)["ports"][0]["containerPort"] = "5000"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(sts, "1.28", strict=True)


# -- names, labels, owners ------------------------------------------------------------------


def test_every_object_is_owned_by_the_mirror_and_carries_the_standard_labels(
        any_mirror: Obj) -> None:
    for obj in build.desired_objects(any_mirror):
        meta = obj["metadata"]
        assert meta["namespace"] == "registry-mirrors"
        (owner,) = meta["ownerReferences"]
        assert owner == {"apiVersion": "eventop.dev/v1", "kind": "RegistryMirror",
                         "name": any_mirror["metadata"]["name"],
                         "uid": any_mirror["metadata"]["uid"], "controller": True,
                         "blockOwnerDeletion": True}
        labels = meta["labels"]
        assert labels["app.kubernetes.io/managed-by"] == "eventop"
        assert labels["app.kubernetes.io/name"] == "registry-mirror"
        assert labels["app.kubernetes.io/component"]
        assert labels["app.kubernetes.io/instance"] == build.label_value(
            any_mirror["metadata"]["name"])
        for value in labels.values():
            assert len(value) <= 63 and LABEL_VALUE.match(value)


def test_names_fit_the_api_servers_limits(any_mirror: Obj) -> None:
    pvc, headless, svc, sts, ds = parts(any_mirror)
    for service_obj in (headless, svc):
        name = service_obj["metadata"]["name"]
        assert len(name) <= 63 and DNS1035.match(name), name
    # pods get controller-revision-hash=<sts>-<10 chars> and statefulset pod-name labels
    assert len(sts["metadata"]["name"]) <= 52
    for obj in (pvc, ds, sts):
        assert len(obj["metadata"]["name"]) <= 63
        assert DNS1123_SUBDOMAIN.match(obj["metadata"]["name"])


@settings(max_examples=200, deadline=None)
@given(st.from_regex(DNS1123_SUBDOMAIN, fullmatch=True).filter(lambda s: len(s) <= 253))
def test_any_valid_mirror_name_gives_valid_object_names(name: str) -> None:
    names = Names.of(name)
    for n in (names.service, names.headless_service):
        assert len(n) <= 63 and DNS1035.match(n), n
    assert len(names.statefulset) <= 52
    for n in (names.pvc, names.daemonset):
        assert len(n) <= 63 and DNS1035.match(n), n
    value = build.label_value(name)
    assert len(value) <= 63 and LABEL_VALUE.match(value)


def test_names_that_differ_only_by_dots_do_not_share_objects() -> None:
    assert Names.of("a.b") != Names.of("a-b")
    assert Names.of("a-b").base == "mirror-a-b"
    long_a, long_b = "x" * 60 + "a", "x" * 60 + "b"
    assert Names.of(long_a) != Names.of(long_b)


# -- semantic rules the schema does not check -------------------------------------------------


def test_workload_selectors_match_their_pod_templates(any_mirror: Obj) -> None:
    _, _, _, sts, ds = parts(any_mirror)
    for workload in (sts, ds):
        template_labels = workload["spec"]["template"]["metadata"]["labels"]
        assert selector_matches(workload["spec"]["selector"], template_labels)
    # and they do not select each other's pods
    assert not selector_matches(sts["spec"]["selector"],
                                ds["spec"]["template"]["metadata"]["labels"])
    assert not selector_matches(ds["spec"]["selector"],
                                sts["spec"]["template"]["metadata"]["labels"])


def test_statefulset_is_governed_by_the_headless_service(any_mirror: Obj) -> None:
    _, headless, svc, sts, _ = parts(any_mirror)
    assert sts["spec"]["serviceName"] == headless["metadata"]["name"]
    assert headless["spec"]["clusterIP"] == "None"
    assert svc["spec"]["type"] == "ClusterIP" and "clusterIP" not in svc["spec"]
    assert sts["spec"]["replicas"] == 1
    # a broken pod must not block the rollout of its fix
    assert sts["spec"]["podManagementPolicy"] == "Parallel"


def test_services_select_the_registry_pods_and_only_them(any_mirror: Obj) -> None:
    _, headless, svc, sts, ds = parts(any_mirror)
    for service_obj in (headless, svc):
        selector = {"matchLabels": service_obj["spec"]["selector"]}
        assert selector_matches(selector, sts["spec"]["template"]["metadata"]["labels"])
        assert not selector_matches(selector, ds["spec"]["template"]["metadata"]["labels"])


def test_service_ports_target_named_container_ports_with_the_same_numbers(
        any_mirror: Obj) -> None:
    _, headless, svc, sts, _ = parts(any_mirror)
    ports = {p["name"]: p for p in container(sts)["ports"]}
    assert ports["http"]["containerPort"] == 5000
    assert ports["metrics"]["containerPort"] == 5001
    for service_obj in (headless, svc):
        for port in service_obj["spec"]["ports"]:
            target = ports[port["targetPort"]]
            assert port["name"] == port["targetPort"]
            assert port["port"] == target["containerPort"]
            assert port["protocol"] == target["protocol"]
    assert [p["port"] for p in svc["spec"]["ports"]] == [5000]


def test_registry_probes_hit_the_registry_api_root_on_its_http_port(any_mirror: Obj) -> None:
    _, _, _, sts, _ = parts(any_mirror)
    c = container(sts)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    env = env_of(sts)
    for probe in (c["readinessProbe"], c["livenessProbe"]):
        get = probe["httpGet"]
        assert get["path"] == "/v2/" and get["scheme"] == "HTTP"
        assert ports[get["port"]] == 5000
        assert env["REGISTRY_HTTP_ADDR"]["value"] == f":{ports[get['port']]}"
    # metrics are on the debug address the container port and Service advertise
    assert env["REGISTRY_HTTP_DEBUG_ADDR"]["value"] == f":{ports['metrics']}"
    annotations = sts["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(ports["metrics"])
    assert annotations["prometheus.io/path"] == env["REGISTRY_HTTP_DEBUG_PROMETHEUS_PATH"][
        "value"] == "/metrics"


def test_registry_env_is_configuration_distribution_reads(any_mirror: Obj) -> None:
    _, _, _, sts, _ = parts(any_mirror)
    env = env_of(sts)
    assert set(env) <= DISTRIBUTION_ENV, set(env) - DISTRIBUTION_ENV
    assert env["REGISTRY_PROXY_REMOTEURL"]["value"] == validate_upstream(
        any_mirror["spec"]["upstream"])
    assert env["REGISTRY_STORAGE_FILESYSTEM_ROOTDIRECTORY"]["value"] == "/var/lib/registry"
    assert env["REGISTRY_HTTP_DEBUG_PROMETHEUS_ENABLED"]["value"] == "true"
    assert all("value" in e or "valueFrom" in e for e in env.values())


def test_cache_volume_is_the_claim_mounted_at_the_storage_root(any_mirror: Obj) -> None:
    pvc, _, _, sts, _ = parts(any_mirror)
    pod = sts["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container(sts)["volumeMounts"]}
    assert volumes[mounts["/var/lib/registry"]]["persistentVolumeClaim"]["claimName"] == \
        pvc["metadata"]["name"]
    assert "emptyDir" in volumes[mounts["/tmp"]]
    assert set(mounts.values()) <= set(volumes)
    assert not sts["spec"].get("volumeClaimTemplates")


def test_storage_size_and_class_come_from_the_spec() -> None:
    pvc, *_ = parts(MIRRORS["quay-with-class"])
    assert pvc["spec"]["resources"]["requests"]["storage"] == "20Gi"
    assert pvc["spec"]["storageClassName"] == "standard"
    pvc, *_ = parts(MIRRORS["defaults-only"])
    assert pvc["spec"]["resources"]["requests"]["storage"] == "10Gi"
    assert "storageClassName" not in pvc["spec"]  # the cluster's default class


def test_credentials_come_from_the_secret_and_roll_the_pod_when_it_changes() -> None:
    m = MIRRORS["internal-with-credentials"]
    _, _, _, sts, _ = parts(m)
    env = env_of(sts)
    for key in ("username", "password"):
        ref = env[f"REGISTRY_PROXY_{key.upper()}"]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": "internal-registry-credentials", "key": key}
    annotations = sts["spec"]["template"]["metadata"]["annotations"]
    assert annotations["eventop.dev/credentials-version"] == "42"
    _, _, _, public, _ = parts(MIRRORS["docker-hub"])
    assert "REGISTRY_PROXY_USERNAME" not in env_of(public)
    assert "eventop.dev/credentials-version" not in public["spec"]["template"]["metadata"][
        "annotations"]


@pytest.mark.parametrize(("ttl", "env_ttl", "delete_enabled"), [
    (None, "168h", "true"), ("168h", "168h", "true"), ("1h30m", "1h30m", "true"),
    ("0", "0s", "false"), ("0s", "0s", "false"), ("0h0m", "0s", "false"),
])
def test_ttl_sets_proxy_expiry_and_storage_deletes_only_when_entries_expire(
        ttl: str | None, env_ttl: str, delete_enabled: str) -> None:
    m = mirror() if ttl is None else mirror(ttl=ttl)
    env = env_of(parts(m)[3])
    assert env["REGISTRY_PROXY_TTL"]["value"] == env_ttl
    assert env["REGISTRY_STORAGE_DELETE_ENABLED"]["value"] == delete_enabled


def test_node_proxy_serves_the_host_port_and_forwards_to_the_cluster_ip_service(
        any_mirror: Obj) -> None:
    _, _, svc, _, ds = parts(any_mirror)
    c = container(ds)
    (port,) = c["ports"]
    assert port["hostPort"] == any_mirror["spec"].get("hostPort", 5000)
    assert port["containerPort"] == 8080  # unprivileged whatever the hostPort
    conf = env_of(ds)["NGINX_CONF"]["value"]
    assert f"listen {port['containerPort']};" in conf
    target = f"{svc['metadata']['name']}.@SEARCH@:{svc['spec']['ports'][0]['port']}"
    assert f"set $registry {target};" in conf and "proxy_pass $registry;" in conf
    assert c["command"] == ["/bin/sh", "-c", build.PROXY_START]
    assert "pid /tmp/nginx.pid;" in conf
    assert c["readinessProbe"]["httpGet"]["port"] == port["name"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/v2/"
    assert c["livenessProbe"]["tcpSocket"]["port"] == port["name"]
    assert {"operator": "Exists"} in ds["spec"]["template"]["spec"]["tolerations"]
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert "/tmp" in mounts


def test_pods_run_restricted(any_mirror: Obj) -> None:
    _, _, _, sts, ds = parts(any_mirror)
    for workload in (sts, ds):
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] > 0
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod["automountServiceAccountToken"] is False
        assert pod["enableServiceLinks"] is False
        sc = container(workload)["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["capabilities"] == {"drop": ["ALL"]}
        resources = container(workload)["resources"]
        assert resources["requests"]["cpu"] and resources["limits"]["memory"]
    # the cache claim is writable by the registry's uid
    pod = sts["spec"]["template"]["spec"]
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsUser"]


def test_images_are_pinned_and_overridable() -> None:
    _, _, _, sts, ds = parts(MIRRORS["docker-hub"])
    assert container(sts)["image"] == "docker.io/library/registry:3.0.0"
    assert re.search(r":\d+\.\d+\.\d+", container(ds)["image"])
    m = mirror(image={"registry": "registry.example/registry:3.0.0@sha256:" + "a" * 64,
                      "proxy": "registry.example/nginx-unprivileged:1.28.0-alpine"})
    _, _, _, sts, ds = parts(m)
    assert container(sts)["image"].startswith("registry.example/registry:3.0.0@sha256:")
    assert container(ds)["image"] == "registry.example/nginx-unprivileged:1.28.0-alpine"
