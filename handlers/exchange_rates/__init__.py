"""ExchangeRate: keep a ConfigMap filled with a currency rate from Frankfurter (ECB data).

One desired-state controller, ``exchange-rates`` (see ``docs/ENGINE.md``): for each
ExchangeRate, :func:`exchange_rate` gets the provider's answer (the one piece of I/O, in
:mod:`.fetch`: see there where and why) and hands it to the pure :func:`.desired.desired`,
which says what the ConfigMap and status should be; the engine writes the differences.
What starts a run:

* the ExchangeRate changed (its own status writes excepted: the engine drops those echoes):
  unless this generation is already fetched and written, its rate is fetched and written
  at once;
* its ConfigMap changed or was deleted (the engine maps an owned object to its owner):
  restored, from the last answer if a refresh gave one moments ago, else fetched;
* the scheduled refresh (``dev.eventop.exchangerates.refresh`` from the CronJob,
  ``dev.knative.sources.ping`` from the PingSource): every ExchangeRate, with ONE provider
  request per base currency (none for a base the provider answered or failed for within
  the last minute: a refresh delivered again reuses that, see :mod:`.fetch`).

Provider failures never fail the event, and the ConfigMap keeps the last good rate (status
holds that answer: a ConfigMap deleted or edited during an outage is written back from
it). They are reported in
status (``Ready=False`` with the reason) and as a Warning Event; the first rate fetched
after them posts a Normal ``Recovered`` one. An outage the status
already reports is no reason to ask the sender for redelivery (each retry would hold a
delivery slot and a router thread for the provider's own retries); the next change of the
object, and the next scheduled refresh, ask again; an ExchangeRate that has no rate yet (its
first fetch met an outage) is also asked again every minute, instead of staying empty until
the hourly refresh. A failure is reused for a minute by every run of its base (see
:mod:`.fetch`), so an outage costs requests per base, not per ExchangeRate. Kubernetes
API failures do fail the run (retried with backoff; the event is answered 5xx).

A deleted ExchangeRate's ConfigMap carries an ownerReference, so the garbage collector
removes it; :func:`exchange_rate_deleted` (an event function) also deletes it at once (uid
precondition) so that nothing is left where the garbage collector lags.
"""

from __future__ import annotations

import logging
from typing import Any

from eventop.engine import Controller, Desired, Reads, SpecError
from eventop.events import PING_TYPE, REFRESH_TYPE, kube_change_types
from eventop.handlers.events import Event
from eventop.handlers.exchange_rates import fetch
from eventop.handlers.exchange_rates.desired import (
    API_VERSION,
    CONFIGMAP,
    EXCHANGE_RATE,
    KIND,
    base_of,
    check_spec,
    currency_of,
    decided_at,
    desired,
    earlier_ones,
    good_since,
    is_converged,
    written_ahead,
    written_at,
)
from eventop.handlers.exchange_rates.provider import not_asked
from eventop.handlers.registry import Registry
from eventop.kube import Kube, is_owned_by, now_rfc3339

#: This package's handlers; :func:`eventop.handlers.load` includes it in the router's.
registry = Registry()

log = logging.getLogger("eventop.exchange_rates")

Obj = dict[str, Any]

#: Seconds until a run that found its ConfigMap written ahead of its status (another
#: replica's run between its two writes) looks again.
AHEAD_RECHECK = 2.0

rates = Controller("exchange-rates", parent=EXCHANGE_RATE, owns=[CONFIGMAP],
                   registry=registry,
                   # A ConfigMap someone else owns is reported in status (ConfigMapConflict).
                   conflict_events=False)
rates.adopts(earlier_ones)


@rates.reconcile
def exchange_rate(cr: Obj, reads: Reads) -> Desired:
    """Fetch what this run needs (see :mod:`.fetch`), then the pure decision."""
    check_spec(cr)
    meta = cr["metadata"]
    cm = reads.get(CONFIGMAP, meta["name"], meta["namespace"])
    answers = fetch.answers()
    # Not an answer older than what the status or the ConfigMap already holds (another
    # replica's refresh writes the ConfigMap first: its status may not be cached yet), nor
    # a failure older than good news they hold.
    since = {"not_before": max(decided_at(cr), written_at(cm)),
             "failure_not_before": good_since(cr, cm)}
    converged = is_converged(cr, cm)
    answer = answers.recent(base_of(cr), currency_of(cr), **since, run_failures=not converged)
    if converged and not_asked(answer):
        answer = None  # the refresh ran out of time before its base: no news, no failure
    now = now_rfc3339()
    if answer is None and not converged:
        if written_ahead(cr, cm, now, fetch.TTL):
            return Desired(prune=False, requeue_after=AHEAD_RECHECK, summary=(
                f"ExchangeRate {meta['namespace']}/{meta['name']}: another replica is "
                f"between its ConfigMap and status writes of an answer fetched at most "
                f"{fetch.TTL:g}s ago: looked at again in {AHEAD_RECHECK:g}s, not asked again"))
        answer = answers.fetch(base_of(cr), currency_of(cr), **since)
    return desired(cr, cm, answer, now)


@rates.triggers(REFRESH_TYPE, PING_TYPE)
def refresh(event: Event, reads: Reads) -> list[Obj]:
    """Every ExchangeRate, after asking the provider once per base currency for them all."""
    crs = [cr for cr in reads.list(EXCHANGE_RATE)
           if not cr["metadata"].get("deletionTimestamp")]
    wanted: dict[str, set[str]] = {}
    for cr in crs:
        try:
            check_spec(cr)
        except SpecError:
            continue  # its run reports it, without asking the provider
        wanted.setdefault(base_of(cr), set()).add(currency_of(cr))
    asked = fetch.answers().refresh(wanted)
    # (bases, not HTTP requests: each base is one request plus the client's retries)
    log.info("refresh: %d ExchangeRate(s), %d base(s) asked of the provider, %d answered "
             "from the last %gs", len(crs), len(asked), len(wanted) - len(asked), fetch.TTL)
    return crs


@registry.on(*kube_change_types("delete"), api_version=API_VERSION, kind=KIND)
def exchange_rate_deleted(event: Event, kube: Kube) -> str:
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
    if current is not None and is_owned_by(cm, current["metadata"]["uid"]):
        return f"ExchangeRate {where} exists again and owns its ConfigMap; left in place"
    owners = [r for r in cm["metadata"].get("ownerReferences") or []
              if r.get("kind") == KIND and r.get("name") == ref.name
              and (ref.uid is None or r.get("uid") == ref.uid)]
    if not owners:
        return f"ConfigMap {where} is not owned by the deleted ExchangeRate; left alone"
    deleted = kube.delete("v1", "ConfigMap", ref.name, ref.namespace,
                          uid=cm["metadata"].get("uid"))
    return f"ConfigMap {where} {'deleted' if deleted else 'already gone'}"


__all__ = ["exchange_rate", "exchange_rate_deleted", "rates", "refresh", "registry"]
