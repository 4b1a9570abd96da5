"""Record what a real API server answers to kubectl's everyday requests.

    python tests/localkube/record_kubectl.py KUBECONFIG [OUT_DIR]

Writes ``tests/recordings/kubectl/`` (or OUT_DIR): Tables (``as=Table``) for every kind
localkube serves, PartialObjectMetadata(List) answers and their 406s, a metadata-only
watch, and the answers to ``fieldValidation``. It creates its objects in the namespace
``kubectl-rec`` (and one cluster-scoped CopyRule) with ``kubectl apply``, so a second run
records the same shapes. Needs eventop's CRDs installed and ``kubectl`` on the PATH (or in
the venv). Not part of the test suite: run it by hand against a real cluster and commit the
output with the server version in ``tests/recordings/README.md``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import requests
import yaml

REPO = Path(__file__).resolve().parents[2]
NS = "kubectl-rec"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"
POM = "application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io"
POML = "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io"

OBJECTS = f"""
apiVersion: v1
kind: Namespace
metadata: {{name: {NS}, labels: {{team: a}}}}
---
apiVersion: v1
kind: ConfigMap
metadata: {{name: settings, namespace: {NS}, labels: {{app: web}}}}
data: {{a: "1", b: "2"}}
---
apiVersion: v1
kind: Secret
metadata: {{name: token, namespace: {NS}}}
type: Opaque
stringData: {{token: abc}}
---
apiVersion: v1
kind: ServiceAccount
metadata: {{name: robot, namespace: {NS}}}
---
apiVersion: v1
kind: Service
metadata: {{name: web, namespace: {NS}}}
spec:
  selector: {{app: web}}
  ports: [{{name: http, port: 80, targetPort: 8080}}, {{name: dns, port: 53, protocol: UDP}}]
---
apiVersion: v1
kind: Service
metadata: {{name: web-headless, namespace: {NS}}}
spec:
  clusterIP: None
  selector: {{app: web}}
  ports: [{{port: 80}}]
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: data, namespace: {NS}}}
spec:
  accessModes: [ReadWriteOnce]
  resources: {{requests: {{storage: 1Gi}}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: tool, namespace: {NS}}}
spec:
  containers: [{{name: tool, image: busybox:1.36}}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: web, namespace: {NS}}}
spec:
  replicas: 2
  selector: {{matchLabels: {{app: web}}}}
  template:
    metadata: {{labels: {{app: web}}}}
    spec: {{containers: [{{name: nginx, image: "nginx:1.25"}}, {{name: side, image: busybox}}]}}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {{name: db, namespace: {NS}}}
spec:
  serviceName: db
  replicas: 1
  selector: {{matchLabels: {{app: db}}}}
  template:
    metadata: {{labels: {{app: db}}}}
    spec: {{containers: [{{name: db, image: "postgres:16"}}]}}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {{name: proxy, namespace: {NS}}}
spec:
  selector: {{matchLabels: {{app: proxy}}}}
  template:
    metadata: {{labels: {{app: proxy}}}}
    spec:
      nodeSelector: {{kubernetes.io/os: linux}}
      containers: [{{name: proxy, image: nginx}}]
---
apiVersion: coordination.k8s.io/v1
kind: Lease
metadata: {{name: leader, namespace: {NS}}}
spec: {{holderIdentity: router-0, leaseDurationSeconds: 15}}
---
apiVersion: v1
kind: Event
metadata: {{name: web.1, namespace: {NS}}}
involvedObject: {{kind: Deployment, name: web, namespace: {NS}, apiVersion: apps/v1}}
reason: Synced
message: synced 3 copies
type: Normal
source: {{component: eventop}}
count: 2
firstTimestamp: "2024-01-01T00:00:00Z"
lastTimestamp: "2024-01-01T00:05:00Z"
---
apiVersion: eventop.dev/v1
kind: RegistryMirror
metadata: {{name: docker-hub, namespace: {NS}}}
spec: {{upstream: "https://registry-1.docker.io"}}
---
apiVersion: eventop.dev/v1
kind: ExchangeRate
metadata: {{name: usd, namespace: {NS}}}
spec: {{currency: USD}}
---
apiVersion: eventop.dev/v1
kind: CopyRule
metadata: {{name: kubectl-rec}}
spec: {{ruleType: configmap, namespaces: [{NS}], selector: {{matchLabels: {{app: web}}}}}}
"""

# (file stem, path) of every collection localkube serves, for the Tables.
COLLECTIONS = [
    ("namespaces", "/api/v1/namespaces"),
    ("configmaps", f"/api/v1/namespaces/{NS}/configmaps"),
    ("secrets", f"/api/v1/namespaces/{NS}/secrets"),
    ("serviceaccounts", f"/api/v1/namespaces/{NS}/serviceaccounts"),
    ("services", f"/api/v1/namespaces/{NS}/services"),
    ("persistentvolumeclaims", f"/api/v1/namespaces/{NS}/persistentvolumeclaims"),
    ("pods", f"/api/v1/namespaces/{NS}/pods"),
    ("events", f"/api/v1/namespaces/{NS}/events"),
    ("deployments", f"/apis/apps/v1/namespaces/{NS}/deployments"),
    ("statefulsets", f"/apis/apps/v1/namespaces/{NS}/statefulsets"),
    ("daemonsets", f"/apis/apps/v1/namespaces/{NS}/daemonsets"),
    ("leases", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases"),
    ("customresourcedefinitions", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"),
    ("registrymirrors", f"/apis/eventop.dev/v1/namespaces/{NS}/registrymirrors"),
    ("exchangerates", f"/apis/eventop.dev/v1/namespaces/{NS}/exchangerates"),
    ("copyrules", "/apis/eventop.dev/v1/copyrules"),
]


class Api:
    def __init__(self, kubeconfig: str) -> None:
        config = yaml.safe_load(Path(kubeconfig).read_text())
        ctx = next(c["context"] for c in config["contexts"]
                   if c["name"] == config["current-context"])
        cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == ctx["cluster"])
        user = next(u["user"] for u in config["users"] if u["name"] == ctx["user"])
        self.url = cluster["server"]
        self.session = requests.Session()
        self.session.trust_env = False  # REQUESTS_CA_BUNDLE would override verify=False
        self.session.verify = not cluster.get("insecure-skip-tls-verify")
        if user.get("token"):
            self.session.headers["Authorization"] = f"Bearer {user['token']}"

    def get(self, path: str, accept: str = "application/json",
            **params: str) -> requests.Response:
        return self.session.get(self.url + path, params=params, headers={"Accept": accept},
                                timeout=30)

    def post(self, path: str, body: Any, **params: str) -> requests.Response:
        return self.session.post(self.url + path, params=params, data=json.dumps(body),
                                 headers={"Content-Type": "application/json"}, timeout=30)

    def watch(self, path: str, accept: str, seconds: int, **params: str) -> list[Any]:
        with self.session.get(self.url + path, stream=True, headers={"Accept": accept},
                              params={"watch": "1", "timeoutSeconds": str(seconds), **params},
                              timeout=seconds + 30) as resp:
            return [json.loads(line) for line in resp.iter_lines() if line]


def kubectl() -> str:
    found = shutil.which("kubectl") or str(REPO / ".venv" / "bin" / "kubectl")
    return found


def save(out: Path, name: str, resp: requests.Response | Any) -> None:
    path = out / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(resp, requests.Response):
        body = {"code": resp.status_code, "body": resp.json()}
    else:
        body = resp
    path.write_text(json.dumps(body, indent=1) + "\n")


def main(kubeconfig: str, out: Path) -> None:
    import urllib3

    urllib3.disable_warnings()
    api = Api(kubeconfig)
    if "--openapi-only" in sys.argv:
        record_openapi(api)
        return
    subprocess.run([kubectl(), "--kubeconfig", kubeconfig, "apply", "-f", "-"],
                   input=OBJECTS.encode(), check=True)
    time.sleep(3)  # let the controllers write status and events
    for stem, path in COLLECTIONS:
        save(out, f"tables/{stem}.json", api.get(path, TABLE))
    cms = f"/api/v1/namespaces/{NS}/configmaps"
    save(out, "tables/configmap-get.json", api.get(f"{cms}/settings", TABLE))
    save(out, "tables/configmaps-include-object.json",
         api.get(cms, TABLE, includeObject="Object"))
    save(out, "tables/configmaps-include-none.json", api.get(cms, TABLE, includeObject="None"))
    save(out, "tables/configmaps-v1beta1.json",
         api.get(cms, "application/json;as=Table;v=v1beta1;g=meta.k8s.io"))
    save(out, "metadata/configmaps-list.json", api.get(cms, POML))
    save(out, "metadata/configmaps-list-limit.json", api.get(cms, POML, limit="1"))
    save(out, "metadata/configmap-get.json", api.get(f"{cms}/settings", POM))
    save(out, "metadata/copyrules-list.json", api.get("/apis/eventop.dev/v1/copyrules", POML))
    save(out, "metadata/copyrule-get.json",
         api.get("/apis/eventop.dev/v1/copyrules/kubectl-rec", POM))
    save(out, "metadata/leases-list-empty.json",
         api.get("/apis/coordination.k8s.io/v1/namespaces/default/leases", POML,
                 labelSelector="none=here"))
    save(out, "metadata/406-object-as-list.json", api.get(f"{cms}/settings", POML))
    save(out, "metadata/406-list-as-object.json", api.get(cms, POM))
    save(out, "metadata/406-custom-list-as-object.json",
         api.get("/apis/eventop.dev/v1/copyrules", POM))
    save(out, "metadata/406-unknown-as.json",
         api.get(cms, "application/json;as=Foo;v=v1;g=meta.k8s.io"))
    save(out, "metadata/406-text-html.json", api.get(cms, "text/html"))
    rv = api.get(cms).json()["metadata"]["resourceVersion"]
    # A change while a metadata-only watch and a Table watch are open; the metadata watch
    # stays open past a minute, long enough for the server to send a BOOKMARK.
    import threading

    results: dict[str, list[Any]] = {}

    def run(key: str, path: str, accept: str, seconds: int, **params: str) -> None:
        results[key] = api.watch(path, accept, seconds, **params)

    threads = [
        threading.Thread(target=run, args=("pom", cms, POM, 70),
                         kwargs={"resourceVersion": rv, "allowWatchBookmarks": "true"}),
        threading.Thread(target=run, args=("table", cms, TABLE, 5)),
        threading.Thread(target=run, args=("poml", cms, POML, 5)),
    ]
    for t in threads:
        t.start()
    time.sleep(1)
    stamp = str(int(time.time()))
    api.post(cms, {"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": f"watched-{stamp}", "namespace": NS},
                   "data": {"k": "v"}})
    for t in threads:
        t.join()
    save(out, "metadata/configmaps-watch.json", results["pom"])
    save(out, "metadata/configmaps-watch-as-list.json", results["poml"])
    save(out, "tables/configmaps-watch.json", results["table"])
    # fieldValidation: the same unknown field, with each directive.
    for directive in ("Strict", "Warn", "Ignore"):
        resp = api.post(cms, {"apiVersion": "v1", "kind": "ConfigMap",
                              "metadata": {"name": f"fv-{directive.lower()}-{stamp}"},
                              "data": {"a": "b"}, "bogus": 1},
                        fieldValidation=directive, dryRun="All")
        save(out, f"validation/configmap-{directive.lower()}.json",
             {"code": resp.status_code, "warning": resp.headers.get("Warning"),
              "body": resp.json()})
        resp = api.post("/apis/eventop.dev/v1/namespaces/kubectl-rec/exchangerates",
                        {"apiVersion": "eventop.dev/v1", "kind": "ExchangeRate",
                         "metadata": {"name": f"fv-{directive.lower()}"},
                         "spec": {"currency": "USD", "curency": "GBP"}},
                        fieldValidation=directive, dryRun="All")
        save(out, f"validation/exchangerate-{directive.lower()}.json",
             {"code": resp.status_code, "warning": resp.headers.get("Warning"),
              "body": resp.json()})
    record_openapi(api)
    print(f"recorded into {out}")


# Built-in kinds whose OpenAPI v3 schemas localkube serves (kubectl explain, field validation).
OPENAPI_KINDS = {
    "api/v1": ("", ["Namespace", "ConfigMap", "Secret", "Service", "PersistentVolumeClaim",
                    "Event", "Pod", "ServiceAccount"]),
    "apis/apps/v1": ("apps", ["StatefulSet", "DaemonSet", "Deployment"]),
    "apis/batch/v1": ("batch", ["Job", "CronJob"]),
    "apis/coordination.k8s.io/v1": ("coordination.k8s.io", ["Lease"]),
    "apis/apiextensions.k8s.io/v1": ("apiextensions.k8s.io", ["CustomResourceDefinition"]),
}


def record_openapi(api: Api) -> None:
    """``localkube/openapi-v1.24.json.gz``: the real component schemas of the built-in kinds
    localkube serves and of what a CRD's document refers to (ObjectMeta...), with every
    schema they reference."""
    import gzip

    schemas: dict[str, Any] = {}
    roots: list[str] = []
    for path, (group, kinds) in OPENAPI_KINDS.items():
        doc = api.get(f"/openapi/v3/{path}").json()
        schemas.update(doc["components"]["schemas"])
        roots += [name for name, schema in doc["components"]["schemas"].items()
                  if any(g["group"] == group and g["kind"] in kinds
                         for g in schema.get("x-kubernetes-group-version-kind", []))]
    crd_doc = api.get("/openapi/v3/apis/eventop.dev/v1").json()["components"]["schemas"]
    schemas.update(crd_doc)
    roots += [name for name in crd_doc if not name.startswith("dev.eventop.")]
    keep: dict[str, Any] = {}
    while roots:
        name = roots.pop()
        if name not in keep:
            keep[name] = schemas[name]
            roots += _refs(schemas[name])
    data = json.dumps(dict(sorted(keep.items())), separators=(",", ":"), sort_keys=True)
    target = REPO / "localkube" / "openapi-v1.24.json.gz"
    target.write_bytes(gzip.compress(data.encode(), mtime=0))


def _refs(schema: Any) -> list[str]:
    if isinstance(schema, dict):
        found = [schema["$ref"].rsplit("/", 1)[-1]] if isinstance(schema.get("$ref"), str) \
            else []
        return found + [r for k, v in schema.items() if k != "$ref" for r in _refs(v)]
    if isinstance(schema, list):
        return [r for v in schema for r in _refs(v)]
    return []


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1], Path(sys.argv[2]) if len(sys.argv) > 2
         else REPO / "tests" / "recordings" / "kubectl")
