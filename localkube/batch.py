"""Jobs and CronJobs (batch/v1) as the real registry admits them: defaults, the generated
selector, and the checks a client can run into (recorded in ``tests/recordings/batch/``).

Modelled: on create, a Job gets ``controller-uid`` and ``job-name`` labels on its pod
template and a selector on the first (unless ``manualSelector``), and the top-level defaults
(``parallelism``, ``completions``, ``backoffLimit``, ``completionMode``, ``suspend``); a
CronJob gets its policy defaults. Refused: a pod ``restartPolicy`` other than OnFailure or
Never, a changed Job selector or pod template, a CronJob name longer than 52 characters (its
Jobs add a suffix), and a schedule the real server's parser (robfig/cron, standard format)
refuses, with its messages. Not modelled: the pod template's own defaults (dnsPolicy,
terminationMessagePath, ...), and no Job or CronJob controller runs (no Pods do): a test
writes the status those controllers would, through the status subresource.
"""

from __future__ import annotations

import json
import re
from typing import Any

from eventop.localkube.errors import cause

Obj = dict[str, Any]

CRONJOB_NAME_MAX = 52  # a DNS-1035 label (63) less the 11 characters of a Job's suffix
RESTART_POLICIES = ("OnFailure", "Never")
DESCRIPTORS = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight",
               "@hourly")
# robfig/cron's standard fields: (minimum, maximum, names)
FIELDS = ((0, 59, {}), (0, 23, {}), (1, 31, {}),
          (1, 12, {m: i + 1 for i, m in enumerate(("jan", "feb", "mar", "apr", "may", "jun",
                                                   "jul", "aug", "sep", "oct", "nov",
                                                   "dec"))}),
          (0, 6, {d: i for i, d in enumerate(("sun", "mon", "tue", "wed", "thu", "fri",
                                              "sat"))}))
GO_DURATION = re.compile(r"^[-+]?((\d+(\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h))+$")


def _q(value: Any) -> str:
    return json.dumps(value)


# -- defaults -------------------------------------------------------------------------------

def default_job(job: Obj, old: Obj | None) -> None:
    job.setdefault("status", {})
    spec = job.setdefault("spec", {})
    if spec.get("completions") is None and spec.get("parallelism") is None:
        spec["completions"] = 1
    spec.setdefault("parallelism", 1)
    spec.setdefault("backoffLimit", 6)
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)
    _template_meta(spec)
    if old is None and not spec.get("manualSelector"):
        meta = job["metadata"]
        generated = {"controller-uid": meta["uid"]}
        spec["selector"] = {"matchLabels": generated}
        template_meta = spec.setdefault("template", {}).setdefault("metadata", {})
        template_meta["labels"] = {**(template_meta.get("labels") or {}), **generated,
                                   "job-name": meta["name"]}


def default_cronjob(cronjob: Obj) -> None:
    cronjob.setdefault("status", {})
    spec = cronjob.setdefault("spec", {})
    spec.setdefault("concurrencyPolicy", "Allow")
    spec.setdefault("suspend", False)
    spec.setdefault("successfulJobsHistoryLimit", 3)
    spec.setdefault("failedJobsHistoryLimit", 1)
    job_template = spec.setdefault("jobTemplate", {})
    job_template.setdefault("metadata", {}).setdefault("creationTimestamp", None)
    _template_meta(job_template.setdefault("spec", {}))


def _template_meta(job_spec: Obj) -> None:
    """An embedded object's metadata is serialized with ``"creationTimestamp": null``."""
    meta = job_spec.setdefault("template", {}).setdefault("metadata", {})
    meta.setdefault("creationTimestamp", None)


# -- validation -----------------------------------------------------------------------------

def _restart_policy(pod_template: Any, path: str) -> list[Obj]:
    policy = (((pod_template or {}).get("spec") or {}).get("restartPolicy")) or "Always"
    if policy in RESTART_POLICIES:
        return []
    return [cause("FieldValueRequired", f"{path}.spec.restartPolicy",
                  'Required value: valid values: "OnFailure", "Never"')]


def job_causes(job: Obj, old: Obj | None) -> list[Obj]:
    spec = job.get("spec") or {}
    causes = _restart_policy(spec.get("template"), "spec.template")
    if old is not None:
        old_spec = old.get("spec") or {}
        if spec.get("selector") != old_spec.get("selector"):
            causes.append(cause("FieldValueInvalid", "spec.selector",
                                f"Invalid value: {_q(spec.get('selector'))}: field is immutable"))
        if spec.get("template") != old_spec.get("template"):
            # The real message prints the whole Go struct; its field and ending are these.
            causes.append(cause("FieldValueInvalid", "spec.template",
                                "Invalid value: core.PodTemplateSpec{...}: field is immutable"))
    return causes


def cronjob_causes(cronjob: Obj) -> list[Obj]:
    name = str((cronjob.get("metadata") or {}).get("name", ""))
    spec = cronjob.get("spec") or {}
    causes = []
    if len(name) > CRONJOB_NAME_MAX:
        causes.append(cause("FieldValueInvalid", "metadata.name",
                            f"Invalid value: {_q(name)}: must be no more than "
                            f"{CRONJOB_NAME_MAX} characters"))
    schedule = str(spec.get("schedule") or "")
    if not schedule:
        causes.append(cause("FieldValueRequired", "spec.schedule", "Required value"))
    else:
        problem = schedule_error(schedule)
        if problem:
            causes.append(cause("FieldValueInvalid", "spec.schedule",
                                f"Invalid value: {_q(schedule)}: {problem}"))
    template = ((spec.get("jobTemplate") or {}).get("spec") or {}).get("template")
    return causes + _restart_policy(template, "spec.jobTemplate.spec.template")


def schedule_error(schedule: str) -> str | None:
    """robfig/cron's ``ParseStandard`` error for ``schedule`` (None: accepted)."""
    if schedule.startswith("@"):
        if schedule in DESCRIPTORS:
            return None
        if schedule.startswith("@every "):
            every = schedule[len("@every "):]
            return None if GO_DURATION.match(every) else (
                f"failed to parse duration {schedule}: time: invalid duration {_q(every)}")
        return f"unrecognized descriptor: {schedule}"
    fields = schedule.split()
    if len(fields) != len(FIELDS):
        return (f"expected exactly {len(FIELDS)} fields, found {len(fields)}: "
                f"[{' '.join(fields)}]")
    for text, (low, high, names) in zip(fields, FIELDS, strict=True):
        for part in text.split(","):
            problem = _range_error(part, low, high, names)
            if problem:
                return problem
    return None


def _range_error(expr: str, low: int, high: int, names: dict[str, int]) -> str | None:
    range_and_step = expr.split("/")
    low_and_high = range_and_step[0].split("-")
    if low_and_high[0] in ("*", "?"):
        start, end = low, high
    else:
        try:
            start = _number(low_and_high[0], names)
            end = _number(low_and_high[1], names) if len(low_and_high) == 2 else start
        except ValueError as exc:
            return f"{exc}"
        if len(low_and_high) > 2:
            return f"too many hyphens: {expr}"
    if len(range_and_step) == 2:
        try:
            step = _number(range_and_step[1], {})
        except ValueError as exc:
            return f"{exc}"
        if step <= 0:
            return f"step of range should be a positive number: {expr}"
        if len(low_and_high) == 1 and low_and_high[0] not in ("*", "?"):
            end = high  # "N/step" means N through the maximum
    elif len(range_and_step) > 2:
        return f"too many slashes: {expr}"
    if start < low:
        return f"beginning of range ({start}) below minimum ({low}): {expr}"
    if end > high:
        return f"end of range ({end}) above maximum ({high}): {expr}"
    if start > end:
        return f"beginning of range ({start}) beyond end of range ({end}): {expr}"
    return None


def _number(text: str, names: dict[str, int]) -> int:
    if text.lower() in names:
        return names[text.lower()]
    if not re.fullmatch(r"[+-]?\d+", text):
        raise ValueError(f"failed to parse int from {text}: strconv.Atoi: parsing {_q(text)}: "
                         "invalid syntax")
    value = int(text)
    if value < 0:
        raise ValueError(f"negative number ({value}) not allowed: {text}")
    return value
