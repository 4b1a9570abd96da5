"""The README's "Writing your own handler", followed to the letter in a new directory outside
the repository: install eventop with its test kit into a fresh virtualenv, write the handler
and its tests from the README's code blocks, run them with the kit, then run the handler by
hand with the router and the watcher and find its result in the router's log.

The only additions to what the README says: the exact pinned versions (the README names the
``-c requirements.txt`` option), free ports instead of 8001/8080 (other servers may run on
this machine), and kubectl from eventop's own virtualenv on ``PATH`` (a user has their own).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from eventop.testing import eventually, free_port

REPO = Path(__file__).resolve().parents[2]
SECTION = "## Writing your own handler"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def readme_blocks() -> list[tuple[str, str]]:
    """The section's code blocks, as (language, text), in order."""
    text = (REPO / "README.md").read_text()
    section = text[text.index(SECTION):]
    following = section.find("\n## ", len(SECTION))
    section = section[:following if following > 0 else None]
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(section)]


def bash(script: str, cwd: Path, env: dict[str, str], timeout: float,
         new_session: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-e", "-c", script], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=timeout,
                          start_new_session=new_session)


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("curl") is None,
                    reason="the README's commands need bash and curl")
def test_the_readme_takes_a_new_user_from_a_handler_to_its_result_in_the_log(
        tmp_path: Path) -> None:
    blocks = readme_blocks()
    install = next(text for lang, text in blocks if lang == "sh" and "pip install" in text)
    files = {m.group(1): text for _, text in blocks
             if (m := re.match(r"# my-operator/(\S+)\n", text))}
    assert set(files) == {"handler.py", "pytest.ini", "test_handler.py", "teams.py"}
    del files["teams.py"]  # the desired-state example: its own test below
    run_tests = next(text for lang, text in blocks
                     if lang == "sh" and text.strip().startswith("python -m pytest"))
    run_by_hand = next(text for lang, text in blocks if text.startswith("# my-operator: run"))
    [shown] = [text.strip() for lang, text in blocks if lang == "" and "eventop.router" in text]

    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("EVENTOP_", "VIRTUAL_ENV", "PYTHON", "KUBECONFIG", "K_SINK"))}
    env["EVENTOP"] = str(REPO)
    # 1. install: the README's commands, with the pinned versions it mentions
    proc = bash(install.replace('pip install "$EVENTOP[testing]"',
                                'pip install -q -c "$EVENTOP/requirements.txt" '
                                '"$EVENTOP[testing]"'), tmp_path, env, 600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    project = tmp_path / "my-operator"
    venv_bin = project / ".venv" / "bin"
    assert (venv_bin / "python").exists()
    env["VIRTUAL_ENV"] = str(project / ".venv")
    env["PATH"] = os.pathsep.join([str(venv_bin), env.get("PATH", ""),
                                   str(Path(sys.executable).parent)])  # kubectl
    # 2 and 3. the handler and its tests, run with the kit
    for name, text in files.items():
        (project / name).write_text(text)
    proc = bash(run_tests, project, env, 600)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-2000:]
    assert re.search(r"\b2 passed\b", proc.stdout), proc.stdout[-2000:]
    # 4. by hand: the README's commands, on free ports
    script = run_by_hand.replace("API=8001 ROUTER=8080",
                                 f"API={free_port()} ROUTER={free_port()}")
    assert script != run_by_hand
    started = subprocess.Popen(["bash", "-e", "-c", script], cwd=project, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        out, _ = started.communicate(timeout=120)
        assert started.returncode == 0, out
        assert "configmap/settings created" in out
        pattern = (r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} INFO  eventop\.router: "
                   r"add ConfigMap default/settings: handler\.checksum: checksum "
                   r"[0-9a-f]{12} written \(200 in [\d.]+ ms\)$")
        assert re.match(pattern, shown), f"the README shows another line: {shown}"
        line = eventually(lambda: re.search(pattern, (project / "router.log").read_text(),
                                            re.M), 60, "the handler's result in router.log")
        assert line
    finally:
        with contextlib.suppress(ProcessLookupError):  # the API server, router and watcher
            os.killpg(started.pid, signal.SIGTERM)


def test_the_readmes_desired_state_controller_makes_the_roster_and_refuses_a_duplicate(
        tmp_path: Path) -> None:
    """The section's second handler, as written there, run by the engine's in-memory World."""
    from eventop.engine.testing import World
    from eventop.handlers import load

    [text] = [text for _, text in readme_blocks() if text.startswith("# my-operator/teams.py")]
    (tmp_path / "teams.py").write_text(text)
    registry = load(str(tmp_path / "teams.py"), builtin="none")
    [ctl] = registry.controllers
    team = {"apiVersion": "example.com/v1", "kind": "Team",
            "metadata": {"name": "a", "namespace": "teams"}, "spec": {"members": ["ann"]}}
    world = World([team])
    world.converge(ctl)
    assert world.get("v1/ConfigMap", "a-roster", "teams")["data"] == {"members": "ann"}
    assert world.get("example.com/v1/Team", "a", "teams")["status"] == {
        "members": 1, "conflicts": []}
    world.put({**team, "spec": {"members": ["ann", "ann"]}})
    world.converge(ctl)
    [ready] = world.get("example.com/v1/Team", "a", "teams")["status"]["conditions"]
    assert (ready["status"], ready["reason"]) == ("False", "DuplicateMember")
