"""Every object a Database becomes passes the Kubernetes API schema (strict: an unknown field
is an error) and holds together in the ways a schema does not check."""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from eventop.handlers.databases import jobs, plan, workload
from eventop.handlers.databases.spec import Names, parse_spec
from eventop.handlers.databases.workload import Passwords
from eventop.kube import selector_matches
from tests.databases.test_lifecycle import created
from tests.databases.world import World, database
from tests.install.support import KUBERNETES_VERSIONS

Obj = dict[str, Any]
HERE = Path(__file__).resolve().parent
EXAMPLES = sorted((HERE.parents[1] / "crds" / "examples").glob("database-*.yaml"))


def example_databases() -> list[Obj]:
    found = []
    for path in EXAMPLES:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc["kind"] == "Database":
                doc["metadata"]["uid"] = "0123456789abcdef"
                found.append(doc)
    return found


DATABASES = {
    "defaults": database(),
    "replicated-17": database("inventory", version="17", replicas=3, snapshotClassName="csi",
                              backup={"schedule": "0 */6 * * *", "retention": 28,
                                      "storage": {"size": "50Gi",
                                                  "storageClassName": "standard"}}),
    "long-dotted-name": database("team." + "x" * 200 + ".db", version="18.1"),
    "image-override": database("custom", version="15", image="registry.example/pg:15-custom"),
    **{f"example-{d['metadata']['name']}": d for d in example_databases()},
}


def every_object(db: Obj) -> list[Obj]:
    spec = parse_spec(db)
    running = (str(spec.version), spec.image)
    major = spec.version.major
    return [
        workload.config_map(spec), workload.headless_service(spec),
        workload.client_service(spec, major),
        workload.credentials_secret(spec, Passwords("a-b_c", "d", "e")),
        workload.statefulset(spec, running, major), workload.backup_pvc(spec),
        jobs.init_job(spec, running, major), jobs.backup_cronjob(spec, running, major),
        jobs.pre_upgrade_job(spec, ("14.20", "docker.io/library/postgres:14.20")),
        jobs.upgrade_job(spec, 14, running), jobs.final_backup_job(spec, running),
        jobs.volume_snapshot(spec, f"data-{Names.of(spec.name).statefulset(major)}-0",
                             db["metadata"]["uid"]),
    ]


def snapshot_schema() -> Obj:
    crd = yaml.safe_load((HERE / "schemas" / "volumesnapshots.yaml").read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema: Obj = version["schema"]["openAPIV3Schema"]
    return schema


@pytest.mark.parametrize("version", [KUBERNETES_VERSIONS[0], KUBERNETES_VERSIONS[-1]])
@pytest.mark.parametrize("name", sorted(DATABASES))
def test_every_object_passes_the_kubernetes_schema(name: str, version: str) -> None:
    for obj in every_object(DATABASES[name]):
        if obj["kind"] == "VolumeSnapshot":
            jsonschema.validate(obj, snapshot_schema())
        else:
            kubernetes_validate.validate(obj, version, strict=True)


def test_the_snapshot_schema_check_can_fail() -> None:
    bad = every_object(database())[-1]
    bad["spec"]["source"] = {"persistentVolumeClaimName": 5}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, snapshot_schema())


@pytest.mark.parametrize("name", sorted(DATABASES))
def test_names_fit_the_limits_of_what_is_made_from_them(name: str) -> None:
    for obj in every_object(DATABASES[name]):
        meta = obj["metadata"]
        limit = {"StatefulSet": 52, "CronJob": 52, "Job": 63, "Service": 63}.get(
            obj["kind"], 253)
        assert len(meta["name"]) <= limit, (obj["kind"], meta["name"])
        for value in meta["labels"].values():
            assert len(value) <= 63


@pytest.mark.parametrize("name", sorted(DATABASES))
def test_every_pod_meets_the_restricted_pod_security_standard(name: str) -> None:
    for obj in every_object(DATABASES[name]):
        pod = pod_spec(obj)
        if pod is None:
            continue
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod["automountServiceAccountToken"] is False
        for container in pod["containers"] + pod.get("initContainers", []):
            ctx = container["securityContext"]
            assert ctx["allowPrivilegeEscalation"] is False
            assert ctx["capabilities"] == {"drop": ["ALL"]}
            assert ctx["readOnlyRootFilesystem"] is True
            assert container["resources"]["requests"]
        for volume in pod["volumes"]:
            assert set(volume) - {"name"} <= {"emptyDir", "configMap", "persistentVolumeClaim"}


def pod_spec(obj: Obj) -> Obj | None:
    if obj["kind"] in ("StatefulSet", "Job"):
        return obj["spec"]["template"]["spec"]  # type: ignore[no-any-return]
    if obj["kind"] == "CronJob":
        return obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]  # type: ignore[no-any-return]
    return None


def test_the_services_select_the_right_pods() -> None:
    spec = parse_spec(database(replicas=3))
    sts = workload.statefulset(spec, ("16.11", spec.image), 16)
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    assert selector_matches(sts["spec"]["selector"], pod_labels)
    headless = workload.headless_service(spec)
    assert sts["spec"]["serviceName"] == headless["metadata"]["name"]
    assert selector_matches({"matchLabels": headless["spec"]["selector"]}, pod_labels)
    client = workload.client_service(spec, 16)["spec"]["selector"]
    primary = {**pod_labels, "statefulset.kubernetes.io/pod-name": "orders-pg16-0"}
    standby = {**pod_labels, "statefulset.kubernetes.io/pod-name": "orders-pg16-1"}
    assert selector_matches({"matchLabels": client}, primary)
    assert not selector_matches({"matchLabels": client}, standby)
    other_major = workload.statefulset(spec, ("17.7", "x"), 17)
    assert not selector_matches(sts["spec"]["selector"],
                                other_major["spec"]["template"]["metadata"]["labels"])


def test_the_server_listens_where_the_services_and_probes_look() -> None:
    spec = parse_spec(database(port=6543))
    sts = workload.statefulset(spec, ("16.11", spec.image), 16)
    server = sts["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "PGPORT", "value": "6543"} in server["env"]
    assert server["ports"] == [{"name": "postgres", "containerPort": 6543, "protocol": "TCP"}]
    assert "6543" in server["readinessProbe"]["exec"]["command"]
    assert workload.client_service(spec, 16)["spec"]["ports"][0]["port"] == 6543


def test_backups_run_on_the_servers_own_image_into_the_backup_volume() -> None:
    spec = parse_spec(database(version="17"))
    running = (str(spec.version), spec.image)
    sts = workload.statefulset(spec, running, 17)
    cron = jobs.backup_cronjob(spec, running, 17)
    pod = pod_spec(cron)
    assert pod is not None
    assert pod["containers"][0]["image"] == sts["spec"]["template"]["spec"]["containers"][0][
        "image"] == "docker.io/library/postgres:17.7"
    claims = [v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]
              if "persistentVolumeClaim" in v]
    assert claims == [workload.backup_pvc(spec)["metadata"]["name"]]
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["RETENTION"] == "7" and env["PGHOST"] == "orders-pg17-0.orders-hl"


def test_the_credentials_secret_holds_a_working_uri() -> None:
    spec = parse_spec(database(databaseName="shop_orders"))
    secret = workload.credentials_secret(spec, Passwords("s3cret", "su", "rep"))
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert data["uri"] == "postgresql://shop_orders:s3cret@orders.shop.svc:5432/shop_orders"
    assert (data["username"], data["database"], data["host"], data["port"]) == (
        "shop_orders", "shop_orders", "orders.shop.svc", "5432")


def test_passwords_never_show_in_a_repr() -> None:
    assert "s3cret" not in repr(Passwords("s3cret", "s3cret", "s3cret"))


def test_a_kept_data_volume_template_is_reused_as_it_is() -> None:
    world = World(database())
    world.converge()
    sts = world.get("StatefulSet", "orders-pg16")
    sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] = "5Gi"
    world.edit(storage={"size": "50Gi"})
    world.converge()
    template = world.get("StatefulSet", "orders-pg16")["spec"]["volumeClaimTemplates"][0]
    assert template["spec"]["resources"]["requests"]["storage"] == "5Gi"  # immutable


def test_everything_a_database_makes_carries_the_label_the_watcher_selects_on() -> None:
    """The Database handler declares its Services, claims, StatefulSets, Jobs, CronJobs and
    snapshots with the selector ``app.kubernetes.io/managed-by=eventop``: the router caches,
    and the watcher (or Knative's ApiServerSource) watches, only those. A Database's objects,
    the Jobs its CronJob makes and the data volumes its StatefulSet makes must carry it."""
    from eventop.kube.objects import MANAGED_BY, MANAGED_BY_LABEL

    for obj in every_object(DATABASES["replicated-17"]):
        made = [obj]
        if obj["kind"] == "CronJob":
            made.append(obj["spec"]["jobTemplate"])
        if obj["kind"] == "StatefulSet":
            made += obj["spec"]["volumeClaimTemplates"]
        for meta in (m["metadata"] for m in made):
            assert meta["labels"][MANAGED_BY_LABEL] == MANAGED_BY, (obj["kind"], meta)


def test_a_service_port_edited_by_hand_is_put_back_by_a_patch_not_an_apply() -> None:
    """Server-side apply merges a Service's ports by port number: the desired 5432 went
    beside a hand-edited 1234 under the same name and every apply was refused as a
    duplicate (found on a real v1.24 API server; tests/databases/lives.py walks it on one).
    A merge patch replaces the list whole; the apply waits for the next run."""
    world = created(World(database()))
    service = copy.deepcopy(world.get("Service", "orders"))
    service["spec"]["clusterIP"] = "10.96.0.7"
    service["spec"]["ports"][0]["port"] = 1234
    observed = world.observed()
    observed.services = [service]
    result = plan(world.db, observed, world.new_password)
    patch = next(p for p in result.patches if p["kind"] == "Service")
    assert patch == {"apiVersion": "v1", "kind": "Service",
                     "metadata": {"name": "orders", "namespace": "shop"},
                     "spec": {"ports": [{"name": "postgres", "port": 5432,
                                         "targetPort": "postgres", "protocol": "TCP"}]}}
    assert result.held == {("Service", "orders")}
    observed.services = [world.get("Service", "orders")]  # as desired: nothing to patch
    result = plan(world.db, observed, world.new_password)
    assert not [p for p in result.patches if p["kind"] == "Service"] and not result.held
