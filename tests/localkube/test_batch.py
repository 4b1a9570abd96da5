"""Jobs and CronJobs answered as the recorded v1.24 server answered them
(``tests/recordings/batch/``, made by ``record_batch.py``): the generated selector and
defaults, the status subresource, the refusals, the schedule parser's words, the Tables."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from eventop.localkube.batch import schedule_error
from tests.localkube.record_batch import COMPLETE, CRONJOB, CRONJOBS, JOB, JOBS, NS
from tests.localkube.support import Http, recording

Obj = dict[str, Any]
# The pod template's own defaults (dnsPolicy, terminationMessagePath, ...) are not modelled.
POD_DEFAULTS = "template.spec"


def created(http: Http, path: str, body: Obj) -> Obj:
    http.call("POST", "/api/v1/namespaces", {"metadata": {"name": NS}})
    status, answer = http.call("POST", path, body)
    assert status == 201, answer
    return dict(answer)


def uid_free(obj: Any, uid: str) -> Any:
    """``obj`` with its uid (in the generated selector and labels) written as UID."""
    return json.loads(json.dumps(obj).replace(uid, "UID"))


def spec_without_pod_defaults(spec: Obj) -> Obj:
    out = copy.deepcopy(spec)
    out["template"].pop("spec")
    return out


def test_a_job_gets_the_generated_selector_labels_and_defaults_of_the_real_server(
        http: Http) -> None:
    real = recording("batch/job-create.json")["body"]
    mine = created(http, JOBS, JOB)
    assert uid_free(spec_without_pod_defaults(mine["spec"]), mine["metadata"]["uid"]) == \
        uid_free(spec_without_pod_defaults(real["spec"]), real["metadata"]["uid"])
    assert (mine["metadata"]["generation"], mine["status"]) == (1, real["status"]) == (1, {})


def test_a_job_status_is_written_through_its_subresource_as_a_controller_would(
        http: Http) -> None:
    real = recording("batch/job-status-complete.json")["body"]
    created(http, JOBS, JOB)
    status, mine = http.call("PATCH", f"{JOBS}/init/status", COMPLETE,
                             content_type="application/merge-patch+json")
    assert status == 200, mine
    # active and ready come from the real Job controller (its Pod was made, never ran)
    assert mine["status"] == {k: v for k, v in real["status"].items()
                              if k not in ("active", "ready")}
    assert mine["metadata"]["generation"] == 1
    status, again = http.call("PATCH", f"{JOBS}/init", {"status": {"succeeded": 0}},
                              content_type="application/merge-patch+json")
    assert again["status"]["succeeded"] == 1  # the main resource never writes status


@pytest.mark.parametrize("name,path,body", [
    ("job-422-restart-policy", JOBS, {**JOB, "metadata": {**JOB["metadata"], "name": "always"},
                                      "spec": {**JOB["spec"], "template": {
                                          **JOB["spec"]["template"], "spec": {
                                              **JOB["spec"]["template"]["spec"],
                                              "restartPolicy": "Always"}}}}),
    ("cronjob-422-schedule", CRONJOBS, {**CRONJOB, "metadata": {
        **CRONJOB["metadata"], "name": "bad-schedule"},
        "spec": {**CRONJOB["spec"], "schedule": "0 0 * *"}}),
    ("cronjob-422-name-too-long", CRONJOBS, {**CRONJOB, "metadata": {
        **CRONJOB["metadata"], "name": "b" * 53}}),
])
def test_what_the_real_server_refuses_is_refused_with_its_body(http: Http, name: str,
                                                                path: str, body: Obj) -> None:
    http.call("POST", "/api/v1/namespaces", {"metadata": {"name": NS}})
    assert http.call("POST", path, body) == (422, recording(f"batch/{name}.json")["body"])


def test_a_jobs_pod_template_can_not_change(http: Http) -> None:
    real = recording("batch/job-422-template-immutable.json")["body"]
    job = created(http, JOBS, JOB)
    job["spec"]["template"]["spec"]["containers"][0]["image"] = "postgres:17.7"
    status, mine = http.call("PUT", f"{JOBS}/init", job)
    assert status == 422
    (cause,), (real_cause,) = mine["details"]["causes"], real["details"]["causes"]
    assert (cause["field"], cause["reason"]) == (real_cause["field"], real_cause["reason"])
    assert real_cause["message"].endswith(": field is immutable")
    assert cause["message"].endswith(": field is immutable")


def test_a_cronjob_gets_the_defaults_of_the_real_server(http: Http) -> None:
    real = recording("batch/cronjob-create.json")["body"]
    mine = created(http, CRONJOBS, CRONJOB)
    strip = lambda spec: {k: v for k, v in spec.items() if k != "jobTemplate"}  # noqa: E731
    assert strip(mine["spec"]) == strip(real["spec"])
    assert mine["spec"]["jobTemplate"]["spec"]["backoffLimit"] == 1  # not a Job's defaults
    assert "completions" not in mine["spec"]["jobTemplate"]["spec"]
    assert (mine["metadata"]["generation"], mine["status"]) == (1, real["status"])


@pytest.mark.parametrize("schedule,said", recording("batch/cronjob-schedules.json").items())
def test_schedules_are_parsed_as_the_real_server_parses_them(schedule: str,
                                                             said: str | None) -> None:
    if said is None:
        assert schedule_error(schedule) is None
    elif schedule == "":
        assert said == "Required value"
    else:
        assert f'Invalid value: "{schedule}": {schedule_error(schedule)}' == said


@pytest.mark.parametrize("stem,path,body,age", [("jobs-table", JOBS, JOB, 3),
                                                ("cronjobs-table", CRONJOBS, CRONJOB, 5)])
def test_tables_of_jobs_and_cronjobs_match_the_real_server(http: Http, stem: str, path: str,
                                                           body: Obj, age: int) -> None:
    """Every cell but the Age column (this test's object is younger than the recording's)."""
    real = recording(f"batch/{stem}.json")["body"]
    obj = created(http, path, body)
    if body is JOB:
        http.call("PATCH", f"{JOBS}/init/status", COMPLETE,
                  content_type="application/merge-patch+json")
    resp = http.session.get(http.url + path, headers={
        "Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}, timeout=10)
    mine = resp.json()
    assert mine["columnDefinitions"] == real["columnDefinitions"]
    (row,), (real_row,) = mine["rows"], real["rows"]
    assert uid_free(row["cells"][:age] + row["cells"][age + 1:], obj["metadata"]["uid"]) == \
        uid_free(real_row["cells"][:age] + real_row["cells"][age + 1:],
                 real_row["object"]["metadata"]["uid"])
