"""Converge one ExchangeRate: its ConfigMap, its status, and a Warning Event on failure.

Split from the event handlers so both paths (one CR changed; the scheduled refresh of all
CRs) share exactly the same write rules:

* the ConfigMap is written (created with POST, then server-side applied) only when
  ``rate``, ``base``, ``currency``, ``date`` or ``source`` differ from what it holds, or our
  labels/ownerReference are missing. ``fetchedAt`` alone never causes a write: it records
  when the values it sits next to were fetched, so workloads that restart on ConfigMap
  changes restart only when the ECB publishes a new rate, not every hour;
* on a provider failure the ConfigMap is not touched at all (the last good rate stays),
  status says ``Ready=False`` with the failure's reason and a Warning Event is posted;
* a ConfigMap of the same name that eventop does not manage is never overwritten;
* status is merge-patched only when it changed. ``lastSuccessfulFetch`` moves with every
  successful fetch (so on each refresh: a status write is cheap and restarts nothing).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from eventop.handlers.exchange_rates.provider import ProviderError, Quote
from eventop.kube import now_rfc3339, objects
from eventop.kube.errors import Conflict

log = logging.getLogger("eventop.exchange_rates")

Obj = dict[str, Any]
API_VERSION = "eventop.dev/v1"
KIND = "ExchangeRate"
DEFAULT_BASE = "EUR"
#: The ConfigMap keys whose change is worth a write (``fetchedAt`` is not among them).
VALUE_KEYS = ("rate", "base", "currency", "date", "source")
LABELS_NAME = "exchange-rate"
LABELS_COMPONENT = "rates"


class SpecError(ProviderError):
    """The spec asks a question no provider can answer (e.g. base and currency the same)."""

    reason = "InvalidSpec"


def base_of(cr: Obj) -> str:
    """The base currency; the CRD defaults it to EUR, objects stored before that have none."""
    return str((cr.get("spec") or {}).get("base") or DEFAULT_BASE)


def currency_of(cr: Obj) -> str:
    return str((cr.get("spec") or {}).get("currency") or "")


def check_spec(cr: Obj) -> SpecError | None:
    """What the CRD schema can not say: a rate of a currency against itself is meaningless.

    (The schema already enforces the currency enum and the base pattern on a real API server.)
    """
    base, currency = base_of(cr), currency_of(cr)
    if not currency:
        return SpecError("spec.currency is missing; set it to one of CAD, CHF, GBP, JPY, "
                         "PLN, USD")
    if currency == base:
        return SpecError(f"spec.currency and spec.base are both {base}; a currency has no "
                         f"exchange rate against itself, pick a different base")
    return None


def configmap_for(cr: Obj, quote: Quote) -> Obj:
    """The ConfigMap the ExchangeRate asks for, given the provider's answer."""
    meta = cr["metadata"]
    currency = currency_of(cr)
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {
            "name": meta["name"], "namespace": meta["namespace"],
            "labels": objects.standard_labels(LABELS_NAME, meta["name"], LABELS_COMPONENT),
            "ownerReferences": [objects.owner_reference(cr)],
        },
        "data": {
            "rate": quote.rate(currency), "base": quote.base, "currency": currency,
            "date": quote.date, "source": quote.source, "fetchedAt": quote.fetched_at,
        },
    }


def is_ours(cm: Obj, cr: Obj) -> bool:
    """Is ``cm`` the ConfigMap of this ExchangeRate (or of an earlier one of the same name)?

    An ExchangeRate deleted and created again under the same name leaves a ConfigMap owned
    by the old uid until the garbage collector gets to it; that one is ours to take over.
    """
    for ref in (cm.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("uid") == cr["metadata"]["uid"]:
            return True
        if (ref.get("apiVersion", "").startswith("eventop.dev/") and ref.get("kind") == KIND
                and ref.get("name") == cr["metadata"]["name"]):
            return True
    return False


def needs_write(existing: Obj | None, desired: Obj) -> bool:
    """Only a changed value, or missing ownership/labels, is worth a write."""
    if existing is None:
        return True
    data = existing.get("data") or {}
    if any(data.get(k) != desired["data"][k] for k in VALUE_KEYS):
        return True
    meta = existing.get("metadata") or {}
    if not objects.is_owned_by(existing, desired["metadata"]["ownerReferences"][0]["uid"]):
        return True
    labels = meta.get("labels") or {}
    return any(labels.get(k) != v for k, v in desired["metadata"]["labels"].items())


@dataclass
class Result:
    """What converging one ExchangeRate did, for the handler's log line."""

    name: str
    ok: bool
    wrote_configmap: bool = False
    wrote_status: bool = False
    detail: str = ""


def converge(kube: Any, cr: Obj, outcome: Quote | ProviderError) -> Result:
    """Bring ``cr``'s ConfigMap and status in line with a provider answer or failure.

    Kubernetes API errors propagate (except the CR being gone meanwhile), so the event is
    answered 5xx and redelivered; provider failures are reported, never raised.
    """
    meta = cr["metadata"]
    where = f"{meta['namespace']}/{meta['name']}"
    if isinstance(outcome, Quote):
        try:
            desired = configmap_for(cr, outcome)
        except ProviderError as exc:  # the answer lacks this currency
            outcome = exc
    if isinstance(outcome, ProviderError):
        return _fail(kube, cr, outcome.reason, outcome.message)

    existing = kube.get_or_none("v1", "ConfigMap", meta["name"], meta["namespace"])
    taken = (f"ConfigMap {where} exists and is not managed by this ExchangeRate; eventop "
             "leaves it alone: delete or rename it to let eventop manage it")
    if existing is not None and not is_ours(existing, cr):
        return _fail(kube, cr, "ConfigMapConflict", taken)
    wrote = needs_write(existing, desired)
    if wrote:
        if not _write_configmap(kube, cr, existing, desired):
            return _fail(kube, cr, "ConfigMapConflict", taken)
        log.info("ConfigMap %s: 1 %s = %s %s (%s)", where, desired["data"]["base"],
                 desired["data"]["rate"], desired["data"]["currency"], desired["data"]["date"])
    data = desired["data"]
    message = f"1 {data['base']} = {data['rate']} {data['currency']} on {data['date']}"
    status = {
        "rate": data["rate"], "date": data["date"],
        "lastSuccessfulFetch": outcome.fetched_at,
        "observedGeneration": meta.get("generation"),
        "conditions": objects.set_condition(
            (cr.get("status") or {}).get("conditions"), "Ready", True, "RateFetched",
            message, outcome.fetched_at, meta.get("generation")),
    }
    wrote_status = kube.patch_status_if_changed(cr, status)
    return Result(meta["name"], True, wrote, wrote_status,
                  message + ("" if wrote else " (ConfigMap unchanged)"))


def _write_configmap(kube: Any, cr: Obj, existing: Obj | None, desired: Obj) -> bool:
    """Write the ConfigMap; False if someone else's took its name since ``existing`` was read.

    * none yet: created with POST, which answers 409 if an object was created at the name
      meanwhile. A server-side apply would instead merge our keys and ownerReference into an
      object sharing no field with ours, and the garbage collector would later delete it with
      the ExchangeRate;
    * ours: server-side apply (every field is always applied, so nothing is left behind);
    * an earlier ExchangeRate's of this name: replaced, with a resourceVersion precondition,
      so its old controller reference is dropped. An apply would only add ours next to it
      when the create owns it, and two controller references are refused.
    """
    meta = desired["metadata"]
    if existing is None:
        try:
            kube.create(desired)
            return True
        except Conflict:
            existing = kube.get_or_none("v1", "ConfigMap", meta["name"], meta["namespace"])
            if existing is None or not is_ours(existing, cr):
                return False
    if objects.is_owned_by(existing, cr["metadata"]["uid"]):
        kube.apply(desired)
        return True
    old = existing["metadata"]
    others = [r for r in old.get("ownerReferences") or []
              if not (r.get("kind") == KIND and r.get("name") == old["name"])]
    body = {**existing, "data": {**(existing.get("data") or {}), **desired["data"]}}
    body["metadata"] = {k: v for k, v in old.items() if k != "managedFields"}
    body["metadata"]["labels"] = {**(old.get("labels") or {}), **meta["labels"]}
    body["metadata"]["ownerReferences"] = others + meta["ownerReferences"]
    kube.replace(body)
    return True


def _fail(kube: Any, cr: Obj, reason: str, message: str) -> Result:
    """Report a failure on the CR; the ConfigMap is not read, let alone written."""
    meta = cr["metadata"]
    log.warning("ExchangeRate %s/%s: %s: %s", meta["namespace"], meta["name"], reason, message)
    kube.post_event(cr, "Warning", reason, message)
    status = {
        "observedGeneration": meta.get("generation"),
        "conditions": objects.set_condition(
            (cr.get("status") or {}).get("conditions"), "Ready", False, reason, message,
            now_rfc3339(), meta.get("generation")),
    }
    wrote_status = kube.patch_status_if_changed(cr, status)
    return Result(meta["name"], False, False, wrote_status, f"{reason}: {message}")


def is_converged(kube: Any, cr: Obj) -> bool:
    """Has this generation already been fetched and written, with the ConfigMap in place?

    Used on add/update events: our own status writes come back as update events, and a
    restarted watcher re-sends "add" for every CR; neither should cost a provider request.
    Keeping the rate fresh is the scheduled refresh's job.
    """
    meta, status = cr["metadata"], cr.get("status") or {}
    if status.get("observedGeneration") != meta.get("generation"):
        return False
    ready = objects.get_condition(status, "Ready")
    if ready is None or ready.get("status") != "True":
        return False
    cm = kube.get_or_none("v1", "ConfigMap", meta["name"], meta["namespace"])
    if cm is None or not objects.is_owned_by(cm, meta["uid"]):
        return False
    data = cm.get("data") or {}
    return (data.get("base") == base_of(cr) and data.get("currency") == currency_of(cr)
            and data.get("rate") == status.get("rate"))
