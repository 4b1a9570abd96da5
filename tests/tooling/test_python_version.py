"""An old Python is refused with one line naming the version needed, before anything is made."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import eventop

REPO = Path(__file__).resolve().parents[2]

# Runs the real interpreter, but reports Python 3.10 to the code given with -c (what the
# Makefile's check runs); anything else (making a venv) is a failure of the test.
FAKE_310 = f"""#!{sys.executable}
import sys
if sys.argv[1:2] == ["-c"]:
    sys.version_info = (3, 10, 14, "final", 0)
    exec(sys.argv[2])
else:
    sys.exit("the Makefile went on with Python 3.10: " + " ".join(sys.argv[1:]))
"""


def _make(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """make as a user runs it (not as a sub-make of ``make test``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS"))}
    return subprocess.run(["make", *args], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=60)


def test_the_minimum_python_is_the_same_in_pyproject_makefile_and_package() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert pyproject["project"]["requires-python"] == ">=3.11"
    [makefile] = re.findall(r"^MIN_PYTHON := (\S+)$", (REPO / "Makefile").read_text(), re.M)
    assert makefile == "3.11" == ".".join(map(str, eventop.MIN_PYTHON))
    assert pyproject["tool"]["ruff"]["target-version"] == "py311"


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize("target", ["test", "demo"])
def test_make_refuses_an_old_python_in_one_line_and_makes_nothing(tmp_path: Path,
                                                                  target: str) -> None:
    for name in ("Makefile", "requirements.txt", "pyproject.toml"):
        shutil.copy(REPO / name, tmp_path / name)
    fake = tmp_path / "python3.10"
    fake.write_text(FAKE_310)
    fake.chmod(0o755)
    proc = _make(tmp_path, f"PYTHON={fake}", target)
    assert proc.returncode != 0
    [line] = proc.stderr.splitlines()
    assert (f"eventop needs Python 3.11 or newer, but {fake} is Python 3.10.14: run make with "
            f"PYTHON set to a newer one, e.g. make PYTHON=python3.12 {target}") in line
    assert proc.stdout == ""
    assert not (tmp_path / ".venv").exists()


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_names_a_python_that_does_not_exist(tmp_path: Path) -> None:
    shutil.copy(REPO / "Makefile", tmp_path / "Makefile")
    (tmp_path / "requirements.txt").write_text("")
    (tmp_path / "pyproject.toml").write_text("")
    proc = _make(tmp_path, "PYTHON=no-such-python3", "test")
    assert proc.returncode != 0
    assert "but no-such-python3 is not found" in proc.stderr
    assert not (tmp_path / ".venv").exists()


def test_importing_eventop_on_an_old_python_says_which_version_is_needed() -> None:
    code = "import sys; sys.version_info = (3, 10, 14, 'final', 0); import eventop"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=REPO)
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[-1] == (
        f"ImportError: eventop needs Python 3.11 or newer; {sys.executable} is Python 3.10.14")
