"""ExchangeRate: keep a ConfigMap filled with a currency rate from Frankfurter (ECB data).

Three handlers:

* an ExchangeRate was added or changed (Resource or Reference mode): read it from the API
  server, and unless this generation is already fetched and written, fetch its rate and
  write the ConfigMap at once;
* the scheduled refresh (``dev.eventop.exchangerates.refresh`` from the CronJob,
  ``dev.knative.sources.ping`` from the PingSource): list every ExchangeRate in the cluster
  and refresh them all with ONE provider request per base currency;
* an ExchangeRate was deleted: its ConfigMap carries an ownerReference, so the garbage
  collector removes it; the handler also deletes it itself (uid precondition, idempotent)
  so nothing is left even where GC lags.

Provider failures never touch the ConfigMap (see :mod:`.reconcile`), are reported in status
(``Ready=False`` with the reason, and a Warning Event) and never fail the event:

* add/update: an outage the status already reports is not a reason to ask the sender for
  redelivery. Answering 5xx made our watcher (and a Knative Broker) retry the event with
  backoff, each attempt holding a delivery slot and a router thread for the provider's own
  retries, which stalled unrelated objects for minutes. A new ExchangeRate whose first
  fetch failed is tried again by the next delivery of the object (the watcher's periodic
  resync, every 5 minutes by default, sends it again and it is not converged) and by the
  scheduled refresh, whichever comes first.
* refresh: the schedule is the retry, and a redelivered refresh would repeat the requests
  for the bases that did succeed.

(Minimal change made with the reliability work, issue 11; when this handler moves onto the
desired-state engine, the engine's requeue-after should replace the resync as the retry.)

Kubernetes API failures always propagate (5xx): retrying those is what redelivery is for.
"""

from __future__ import annotations

import logging
from typing import Any

from eventop.events import PING_TYPE, REFRESH_TYPE, kube_change_types
from eventop.handlers.events import Event
from eventop.handlers.exchange_rates import provider
from eventop.handlers.exchange_rates.provider import ProviderError
from eventop.handlers.exchange_rates.reconcile import (
    API_VERSION,
    KIND,
    Result,
    base_of,
    check_spec,
    converge,
    currency_of,
    is_converged,
)
from eventop.handlers.registry import Registry
from eventop.kube import objects
from eventop.kube.errors import KubeError, NotFound

#: This package's handlers; :func:`eventop.handlers.load` includes it in the router's.
registry = Registry()

log = logging.getLogger("eventop.exchange_rates")

Obj = dict[str, Any]


class RefreshIncomplete(Exception):
    """Some ExchangeRates could not be written (Kubernetes API errors); redeliver the refresh."""


@registry.on(*kube_change_types("add", "update"), api_version=API_VERSION, kind=KIND)
def reconcile_exchange_rate(event: Event, kube: Any) -> str:
    """Fetch and write the rate of one ExchangeRate, read fresh from the API server."""
    ref = event.ref
    assert ref is not None  # the registry only routes events with a ref here
    cr = kube.get_or_none(API_VERSION, KIND, ref.name, ref.namespace)
    if cr is None:
        return f"ExchangeRate {ref.namespace}/{ref.name} is gone; nothing to do"
    if cr["metadata"].get("deletionTimestamp"):
        return f"ExchangeRate {ref.namespace}/{ref.name} is being deleted; nothing to do"
    if is_converged(kube, cr):
        return (f"ExchangeRate {ref.namespace}/{ref.name} generation "
                f"{cr['metadata'].get('generation')} already written; the refresh keeps it fresh")
    outcome: provider.Quote | ProviderError | None = check_spec(cr)
    if outcome is None:
        try:
            outcome = provider.get_client().latest(base_of(cr), [currency_of(cr)])
        except ProviderError as exc:
            outcome = exc
    return converge(kube, cr, outcome).detail


@registry.on(*kube_change_types("delete"), api_version=API_VERSION, kind=KIND)
def exchange_rate_deleted(event: Event, kube: Any) -> str:
    """Delete the ConfigMap of a deleted ExchangeRate, unless a new one of that name owns it.

    The garbage collector would do this too; doing it here makes the end state independent
    of GC timing. Only a ConfigMap eventop manages for an ExchangeRate of this name (and of
    this uid, when the event says which) is deleted, with its own uid as precondition.
    """
    ref = event.ref
    assert ref is not None
    where = f"{ref.namespace}/{ref.name}"
    cm = kube.get_or_none("v1", "ConfigMap", ref.name, ref.namespace)
    if cm is None:
        return f"ConfigMap {where} already gone"
    current = kube.get_or_none(API_VERSION, KIND, ref.name, ref.namespace)
    if current is not None and objects.is_owned_by(cm, current["metadata"]["uid"]):
        return f"ExchangeRate {where} exists again and owns its ConfigMap; left in place"
    owners = [r for r in cm["metadata"].get("ownerReferences") or []
              if r.get("kind") == KIND and r.get("name") == ref.name
              and (ref.uid is None or r.get("uid") == ref.uid)]
    if not owners:
        return f"ConfigMap {where} is not owned by the deleted ExchangeRate; left alone"
    deleted = kube.delete("v1", "ConfigMap", ref.name, ref.namespace,
                          uid=cm["metadata"].get("uid"))
    return f"ConfigMap {where} {'deleted' if deleted else 'already gone'}"


@registry.on(REFRESH_TYPE, PING_TYPE)
def refresh_exchange_rates(event: Event, kube: Any) -> str:
    """Refresh every ExchangeRate in the cluster: one provider request per base currency."""
    try:
        listed = kube.list(API_VERSION, KIND)
    except NotFound:
        return ("the ExchangeRate CRD is not installed (kubectl apply -k crds/); "
                "nothing to refresh")
    crs = [cr for cr in listed if not cr["metadata"].get("deletionTimestamp")]
    groups: dict[str, list[Obj]] = {}
    results: list[Result] = []
    errors: list[str] = []
    for cr in crs:
        invalid = check_spec(cr)
        if invalid is not None:
            _converge_one(kube, cr, invalid, results, errors)
        else:
            groups.setdefault(base_of(cr), []).append(cr)
    client = provider.get_client()
    deadline = client.clock() + client.refresh_budget  # one budget for all bases
    for base, members in sorted(groups.items()):
        outcome: provider.Quote | ProviderError
        try:
            outcome = client.latest(base, {currency_of(cr) for cr in members},
                                    deadline=deadline)
        except ProviderError as exc:
            outcome = exc
        for cr in members:
            _converge_one(kube, cr, outcome, results, errors)
    ok = sum(r.ok for r in results)
    written = sum(r.wrote_configmap for r in results)
    summary = (f"refreshed {len(crs)} ExchangeRate(s) with {len(groups)} provider request(s): "
               f"{ok} ok, {len(results) - ok} failed, {written} ConfigMap(s) written")
    if errors:
        raise RefreshIncomplete(f"{summary}; Kubernetes API errors: {'; '.join(errors)}")
    return summary


def _converge_one(kube: Any, cr: Obj, outcome: provider.Quote | ProviderError,
                  results: list[Result], errors: list[str]) -> None:
    """Converge one CR of a refresh; an API error on one must not stop the others."""
    meta = cr["metadata"]
    try:
        results.append(converge(kube, cr, outcome))
    except NotFound:
        log.info("ExchangeRate %s/%s deleted during the refresh", meta["namespace"],
                 meta["name"])
    except KubeError as exc:
        errors.append(f"{meta['namespace']}/{meta['name']}: {exc}")


__all__ = ["RefreshIncomplete", "exchange_rate_deleted", "reconcile_exchange_rate",
           "refresh_exchange_rates"]
