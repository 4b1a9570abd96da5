"""The wheel pip builds from this repository: every room in it, and importable on its own.

``pyproject.toml`` maps each room of the repository (``handlers/``, ``router/``, ...) to a
package ``eventop.<room>`` and lists every subpackage by hand, so a new subpackage or data file
that is not listed is silently left out of the wheel while every test in the repository still
passes (they import the rooms in place). Here the wheel is built with the build backend
``pyproject.toml`` names (offline: its pin is in ``requirements.txt``), from a copy of the
sources, and unpacked into a fresh virtualenv that sees neither the repository nor the
project's editable install: every module must be in it, and import from it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

from tests.install.support import REPO, bare_venv

CONFIG = tomllib.loads((REPO / "pyproject.toml").read_text())
#: What is not part of the sources a wheel is built from.
NOT_SOURCES = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "tests",
                                     "__pycache__", ".pytest_cache", ".ruff_cache", "bench")


def room_of(package: str) -> Path:
    """The folder of the repository that ``package`` is built from, by ``package-dir``."""
    dirs = CONFIG["tool"]["setuptools"]["package-dir"]
    parts = package.split(".")
    for cut in range(len(parts), 0, -1):
        prefix = ".".join(parts[:cut])
        if prefix in dirs:
            return REPO / dirs[prefix] / Path(*parts[cut:])
    raise AssertionError(f"{package}: no package-dir in pyproject.toml covers it")


def expected_files() -> set[str]:
    """Every file the wheel must hold, as ``eventop/...`` paths: each listed package's
    modules and its package data."""
    setuptools = CONFIG["tool"]["setuptools"]
    wanted = set()
    for package in setuptools["packages"]:
        folder = room_of(package)
        inside = Path(*package.split("."))
        wanted |= {(inside / f.name).as_posix() for f in folder.glob("*.py")}
        for pattern in setuptools.get("package-data", {}).get(package, []):
            wanted |= {(inside / f.name).as_posix() for f in folder.glob(pattern)}
    return wanted


def project_name(requirement: str) -> str:
    """``flask`` of ``Flask<4,>=3.1``: the name, as pip compares names."""
    name = re.match(r"\s*([A-Za-z0-9_.-]+)", requirement)
    assert name, requirement
    return re.sub(r"[-_.]+", "-", name.group(1)).lower()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    required = CONFIG["build-system"]["requires"]
    assert required == [f"setuptools=={version('setuptools')}"], (
        f"pyproject.toml builds with {required}, but setuptools {version('setuptools')} is "
        "installed: pin the same in requirements.txt and reinstall (make test does)")
    root = tmp_path_factory.mktemp("wheel")
    sources = root / "src"
    shutil.copytree(REPO, sources, ignore=NOT_SOURCES)
    out = root / "dist"
    out.mkdir()
    built = subprocess.run(
        [sys.executable, "-c", "import sys; from setuptools import build_meta; "
         "print(build_meta.build_wheel(sys.argv[1]))", str(out)],
        cwd=sources, capture_output=True, text=True, timeout=300, check=False)
    assert built.returncode == 0, built.stderr[-3000:]
    return out / built.stdout.strip().splitlines()[-1]


def test_every_subpackage_of_every_room_is_listed_in_pyproject() -> None:
    listed = set(CONFIG["tool"]["setuptools"]["packages"])
    found = set()
    for package, room in CONFIG["tool"]["setuptools"]["package-dir"].items():
        for init in (REPO / room).rglob("__init__.py"):
            if "__pycache__" not in init.parts:
                inner = init.parent.relative_to(REPO / room).parts
                found.add(".".join((package, *inner)))
    assert found - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"


def test_the_wheel_holds_every_module_and_data_file_of_every_room(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    wanted = expected_files()
    assert {"eventop/localkube/openapi-v1.24.json.gz", "eventop/handlers/registry.py",
            "eventop/testing/plugin.py", "eventop/kube/client.py"} <= wanted
    assert wanted - names == set()
    stray = {n for n in names if not n.startswith(("eventop/", "eventop-"))}
    assert stray == set(), "the wheel installs something besides the eventop package"


def test_the_wheel_declares_the_test_kit_plugin_and_the_dependencies(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        info = {Path(n).name: zf.read(n).decode() for n in zf.namelist()
                if n.startswith("eventop-") and ".dist-info/" in n}
    assert "[pytest11]\neventop = eventop.testing.plugin" in info["entry_points.txt"]
    requires = [line.split(":", 1)[1] for line in info["METADATA"].splitlines()
                if line.startswith("Requires-Dist:") and "extra ==" not in line]
    assert sorted(map(project_name, requires)) == sorted(
        map(project_name, CONFIG["project"]["dependencies"]))


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A fresh virtualenv with the wheel unpacked into its site-packages (what an installer
    does with a pure wheel) and the project's dependencies after it, but not the project."""
    root = tmp_path_factory.mktemp("installed")
    python, site = bare_venv(root / "venv")
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    # The project's dependencies, found after the wheel; a path added by a .pth line does not
    # run that folder's own .pth files, so the repository's editable install stays out.
    (site / "zz_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return {"python": str(python), "cwd": str(root), "site": str(site)}


def test_every_module_imports_from_the_installed_wheel_alone(installed: dict[str, Any]) -> None:
    script = """
import importlib, json, pkgutil, sys
import eventop
found, failed = [], {}
for mod in pkgutil.walk_packages(eventop.__path__, "eventop."):
    if mod.name.rpartition(".")[2] == "__main__":
        continue  # runs a command when imported; its package is imported here
    found.append(mod.name)
    try:
        importlib.import_module(mod.name)
    except Exception as exc:
        failed[mod.name] = f"{type(exc).__name__}: {exc}"
files = {m: getattr(sys.modules.get(m), "__file__", None) for m in found}
print(json.dumps({"eventop": eventop.__file__, "found": found, "failed": failed,
                  "files": files}))
"""
    ran = subprocess.run([installed["python"], "-I", "-c", script], cwd=installed["cwd"],
                         env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                         capture_output=True, text=True, timeout=300, check=False)
    assert ran.returncode == 0, ran.stderr[-3000:]
    result = json.loads(ran.stdout.strip().splitlines()[-1])
    assert result["failed"] == {}
    assert result["eventop"].startswith(installed["site"])
    outside = {m: f for m, f in result["files"].items()
               if f and not f.startswith(installed["site"])}
    assert outside == {}, "imported from outside the installed wheel"
    assert repo_modules() - set(result["found"]) == set(), "missing from the installed wheel"


def repo_modules() -> set[str]:
    """Every module of every room in the repository, by the name it is installed under."""
    names = set()
    for package, room in CONFIG["tool"]["setuptools"]["package-dir"].items():
        for path in (REPO / room).rglob("*.py"):
            inner = path.relative_to(REPO / room).with_suffix("").parts
            if "__pycache__" in inner or inner[-1] == "__main__":
                continue
            if inner[-1] == "__init__":
                inner = inner[:-1]
            if inner:
                names.add(".".join((package, *inner)))
    return names


def test_the_installed_local_api_server_serves_its_recorded_schemas(
        installed: dict[str, Any]) -> None:
    """Package data is found where the wheel puts it (kubectl explain reads these schemas)."""
    script = ("from eventop.localkube import openapi; import sys; "
              "sys.stdout.write(str(openapi.DATA))")
    ran = subprocess.run([installed["python"], "-I", "-c", script], cwd=installed["cwd"],
                         env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                         capture_output=True, text=True, timeout=120, check=False)
    assert ran.returncode == 0, ran.stderr[-3000:]
    data = Path(ran.stdout)
    assert data.is_file() and str(data).startswith(installed["site"])
