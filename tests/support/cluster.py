"""Where the cluster suite finds ``../shared/k8s/cluster``, for the faults that restart the
API server or compact etcd of the cluster it was given (``EVENTOP_TEST_CLUSTER_DIR``)."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def cluster_script() -> Path:
    """``EVENTOP_TEST_CLUSTER_SCRIPT``, else ``../shared/k8s/cluster`` beside the checkout."""
    return Path(os.environ.get("EVENTOP_TEST_CLUSTER_SCRIPT")
                or REPO.parent / "shared" / "k8s" / "cluster")


def uncontrollable_reason(state: str | None, script: Path | None) -> str:
    """Why the suite can not restart this cluster's API server: what is missing, named."""
    missing = [] if state else ["EVENTOP_TEST_CLUSTER_DIR (the state dir of the cluster "
                                "../shared/k8s/cluster started)"]
    if script is None or not script.exists():
        missing.append(f"the cluster script at {script} (a checkout beside ../shared, or "
                       "EVENTOP_TEST_CLUSTER_SCRIPT naming it)")
    return "needs " + " and ".join(missing) + " to restart the API server or compact etcd"
