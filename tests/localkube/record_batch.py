"""Record what a real API server answers about Jobs and CronJobs (what a Database writes).

    python -m tests.localkube.record_batch KUBECONFIG [OUT_DIR]

Writes ``tests/recordings/batch/`` (or OUT_DIR), each file ``{"code": ..., "body": ...}``:
a Job and a CronJob as created (the defaults and the generated selector the server adds), a
Job's status written through the status subresource as the Job controller would, the 422s
for a changed pod template, an unsupported restartPolicy, a bad schedule and a CronJob name
too long for the Jobs it makes, what the server says about a list of schedules
(``cronjob-schedules.json``: its message, or null when accepted), and the Tables
``kubectl get jobs,cronjobs`` reads. It works in the namespace ``batch-rec`` (deleted and
made again), so a second run records the same shapes. Not part of the test suite: run it by
hand against a real cluster and commit the output with the server version in
``tests/recordings/README.md``.
"""

from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path
from typing import Any

from tests.localkube.record_kubectl import TABLE, Api

REPO = Path(__file__).resolve().parents[2]
NS = "batch-rec"
JOBS = f"/apis/batch/v1/namespaces/{NS}/jobs"
CRONJOBS = f"/apis/batch/v1/namespaces/{NS}/cronjobs"
Obj = dict[str, Any]

POD: Obj = {"metadata": {"labels": {"app": "db"}},
            "spec": {"restartPolicy": "Never",
                     "containers": [{"name": "job", "image": "postgres:16.11",
                                     "command": ["bash", "-c", "true"]}]}}
JOB: Obj = {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "init", "namespace": NS, "labels": {"app": "db"}},
            "spec": {"backoffLimit": 2, "activeDeadlineSeconds": 600, "template": POD}}
CRONJOB: Obj = {"apiVersion": "batch/v1", "kind": "CronJob",
                "metadata": {"name": "backup", "namespace": NS, "labels": {"app": "db"}},
                "spec": {"schedule": "0 0 * * *", "concurrencyPolicy": "Forbid",
                         "jobTemplate": {"metadata": {"labels": {"app": "db"}},
                                         "spec": {"backoffLimit": 1, "template": POD}}}}
COMPLETE: Obj = {"status": {"startTime": "2026-11-20T10:00:00Z",
                            "completionTime": "2026-11-20T10:01:00Z", "succeeded": 1,
                            "conditions": [{"type": "Complete", "status": "True",
                                            "lastProbeTime": "2026-11-20T10:01:00Z",
                                            "lastTransitionTime": "2026-11-20T10:01:00Z"}]}}


# Schedules the real parser accepts or refuses, each asked with a dry run.
SCHEDULES = ["*/5 * * * *", "0 0 1,15 * mon-fri", "@daily", "@every 90m", "5/15 2-4 * JAN *",
             "@often", "@every soon", "60 * * * *", "* 24 * * *", "0 0 0 * *", "* * * 13 *",
             "* * * * 7", "5-1 * * * *", "*/0 * * * *", "x * * * *", "-1 * * * *",
             "1-2-3 * * * *", "1/2/3 * * * *", "0 0 * * * *", ""]


def main(kubeconfig: str, out: Path) -> None:
    api = Api(kubeconfig)
    api.session.delete(f"{api.url}/api/v1/namespaces/{NS}", timeout=30)
    while api.get(f"/api/v1/namespaces/{NS}").status_code != 404:
        time.sleep(1)
    assert api.post("/api/v1/namespaces", {"metadata": {"name": NS}}).status_code == 201
    out.mkdir(parents=True, exist_ok=True)

    def save(name: str, resp: Any) -> Obj:
        body = resp.json()
        (out / f"{name}.json").write_text(json.dumps({"code": resp.status_code, "body": body},
                                                     indent=1, sort_keys=True) + "\n")
        return dict(body)

    job = save("job-create", api.post(JOBS, JOB))
    changed = copy.deepcopy(job)
    changed["spec"]["template"]["spec"]["containers"][0]["image"] = "postgres:17.7"
    save("job-422-template-immutable", api.session.put(
        f"{api.url}{JOBS}/init", data=json.dumps(changed),
        headers={"Content-Type": "application/json"}, timeout=30))
    save("job-status-complete", api.session.patch(
        f"{api.url}{JOBS}/init/status", data=json.dumps(COMPLETE),
        headers={"Content-Type": "application/merge-patch+json"}, timeout=30))
    always = copy.deepcopy(JOB)
    always["metadata"]["name"] = "always"
    always["spec"]["template"]["spec"]["restartPolicy"] = "Always"
    save("job-422-restart-policy", api.post(JOBS, always))
    save("cronjob-create", api.post(CRONJOBS, CRONJOB))
    bad = copy.deepcopy(CRONJOB)
    bad["metadata"]["name"] = "bad-schedule"
    bad["spec"]["schedule"] = "0 0 * *"
    save("cronjob-422-schedule", api.post(CRONJOBS, bad))
    long = copy.deepcopy(CRONJOB)
    long["metadata"]["name"] = "b" * 53
    save("cronjob-422-name-too-long", api.post(CRONJOBS, long))
    schedules = {}
    for i, schedule in enumerate(SCHEDULES):
        probe = copy.deepcopy(CRONJOB)
        probe["metadata"]["name"] = f"schedule-{i}"
        probe["spec"]["schedule"] = schedule
        resp = api.post(CRONJOBS, probe, dryRun="All")
        schedules[schedule] = None if resp.status_code == 201 else (
            resp.json()["details"]["causes"][0]["message"])
    (out / "cronjob-schedules.json").write_text(json.dumps(schedules, indent=1) + "\n")
    save("jobs-table", api.get(JOBS, TABLE))
    save("cronjobs-table", api.get(CRONJOBS, TABLE))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1], Path(sys.argv[2]) if len(sys.argv) > 2
         else REPO / "tests" / "recordings" / "batch")
