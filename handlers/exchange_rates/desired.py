"""What should exist for one ExchangeRate, given the provider's answer: a pure function.

The rules every path shares (an ExchangeRate changed; the scheduled refresh of them all):

* the ConfigMap is written only when ``rate``, ``base``, ``currency``, ``date`` or ``source``
  differ from what it holds, or our labels/ownerReference are missing. ``fetchedAt`` alone
  never causes a write: it records when the values it sits next to were fetched, so
  workloads that restart on ConfigMap changes restart only when the ECB publishes a new
  rate, not every hour. Those keys and ``fetchedAt`` are all eventop writes (by replace,
  with a resourceVersion precondition), but a key added by hand is no difference (only
  those keys are compared, :func:`same_values`): it stays until the next write, which
  replaces ``data`` as a whole and so drops it;
* on a provider failure the ConfigMap keeps the last good rate: status holds that answer
  (``rate``, ``base``, ``currency``, ``date``, ``source``, ``lastSuccessfulFetch``), so a
  ConfigMap deleted or edited during an outage is written back from it, as a controller
  restores any child it owns (:func:`last_good`; not over a newer answer another replica
  wrote, not for another base or currency). Status says ``Ready=False`` with the failure's
  reason, and a Warning Event is posted at every failed attempt (its ``count`` says how
  many);
* a rate never goes backwards: an answer whose publication ``date`` is older than the one
  status holds for this base and currency is not written (``Ready=True``, reason
  ``StaleAnswer``, see :func:`stale`). A bad rate for this currency in an answer that is
  otherwise good fails only this ExchangeRate (``MalformedAnswer``), as a missing one does;
* an answer dated after tomorrow is not a rate (``ImplausibleDate``, handled like a
  malformed answer: the last good rate is kept, see :func:`implausible`). Were it written,
  the rule above would refuse every real answer after it until that date; for the same
  reason a held date after tomorrow (written by an older version) does not count as "newer";
* a ConfigMap of the same name that eventop does not manage is never written
  (``ConfigMapConflict``); one an earlier ExchangeRate of this name left (deleted and created
  again before the garbage collector ran) is taken over, its old controller reference
  replaced by ours and other owners kept, and so is one that lost its ownerReferences but
  still carries eventop's labels for this name (see :func:`earlier_ones`);
* status is merge-patched only when it changed. ``lastSuccessfulFetch`` moves with every
  successful fetch (so on each refresh: a status write is cheap and restarts nothing).

A spec no provider can answer (a rate of a currency against itself) raises the engine's
``SpecError``: reported as ``Ready=False``/``InvalidSpec`` without asking the provider.
"""

from __future__ import annotations

from datetime import date as Date
from datetime import timedelta
from typing import Any

from eventop.engine import Child, Desired, Note, Outcome, SpecError
from eventop.handlers.exchange_rates.provider import ProviderError, Quote
from eventop.kube import (
    get_condition,
    is_owned_by,
    owner_reference,
    parse_rfc3339,
    set_condition,
    standard_labels,
)

Obj = dict[str, Any]

API_VERSION = "eventop.dev/v1"
KIND = "ExchangeRate"
EXCHANGE_RATE = f"{API_VERSION}/{KIND}"
CONFIGMAP = "v1/ConfigMap"
DEFAULT_BASE = "EUR"
#: The ConfigMap keys whose change is worth a write (``fetchedAt`` is not among them).
VALUE_KEYS = ("rate", "base", "currency", "date", "source")
LABELS_NAME = "exchange-rate"
LABELS_COMPONENT = "rates"


def base_of(cr: Obj) -> str:
    """The base currency; the CRD defaults it to EUR, objects stored before that have none."""
    return str((cr.get("spec") or {}).get("base") or DEFAULT_BASE)


def currency_of(cr: Obj) -> str:
    return str((cr.get("spec") or {}).get("currency") or "")


def check_spec(cr: Obj) -> None:
    """Raise :class:`SpecError` for what the CRD schema can not say: a rate of a currency
    against itself is meaningless. (The schema already enforces the currency enum and the
    base pattern on a real API server.)"""
    base, currency = base_of(cr), currency_of(cr)
    if not currency:
        raise SpecError("spec.currency is missing; set it to one of CAD, CHF, GBP, JPY, PLN, "
                        "USD")
    if currency == base:
        raise SpecError(f"spec.currency and spec.base are both {base}; a currency has no "
                        f"exchange rate against itself, pick a different base")


def configmap_for(cr: Obj, quote: Quote) -> Obj:
    """The ConfigMap the ExchangeRate asks for, given the provider's answer (raises
    :class:`~.provider.MalformedAnswer` if the answer lacks its currency)."""
    meta = cr["metadata"]
    currency = currency_of(cr)
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {
            "name": meta["name"], "namespace": meta["namespace"],
            "labels": labels_for(cr),
            "ownerReferences": [owner_reference(cr)],
        },
        "data": {
            "rate": quote.rate(currency), "base": quote.base, "currency": currency,
            "date": quote.date, "source": quote.source, "fetchedAt": quote.fetched_at,
        },
    }


def labels_for(cr: Obj) -> dict[str, str]:
    """The labels eventop writes on the ConfigMap of ``cr`` (they name the ExchangeRate)."""
    return standard_labels(LABELS_NAME, cr["metadata"]["name"], LABELS_COMPONENT)


def earlier_ones(cr: Obj, cm: Obj) -> bool:
    """Is ``cm`` a ConfigMap eventop made for an ExchangeRate of this name (to take over)?

    Either it still has an earlier ExchangeRate's ownerReference (one deleted and created
    again before the garbage collector ran), or it lost its ownerReferences (removed by
    hand, or the ExchangeRate deleted with ``--cascade=orphan``) and still carries all of
    eventop's labels for this name, as a mirror re-adopts its objects by their labels. One
    that another controller's reference claims is never taken by labels alone.
    """
    meta = cm.get("metadata") or {}
    refs = meta.get("ownerReferences") or []
    if any(ref.get("apiVersion", "").startswith("eventop.dev/") and ref.get("kind") == KIND
           and ref.get("name") == cr["metadata"]["name"] for ref in refs):
        return True
    labels = meta.get("labels") or {}
    return (not any(ref.get("controller") for ref in refs)
            and all(labels.get(k) == v for k, v in labels_for(cr).items()))


def is_ours(cm: Obj, cr: Obj) -> bool:
    """This ExchangeRate's ConfigMap (by uid), or an earlier one's of the same name."""
    return is_owned_by(cm, cr["metadata"]["uid"]) or earlier_ones(cr, cm)


def same_values(existing: Obj, desired: Obj) -> bool:
    """Only a changed value, or missing ownership/labels, is worth a write."""
    data = existing.get("data") or {}
    if any(data.get(k) != desired["data"][k] for k in VALUE_KEYS):
        return False
    meta = existing.get("metadata") or {}
    if not is_owned_by(existing, desired["metadata"]["ownerReferences"][0]["uid"]):
        return False
    labels = meta.get("labels") or {}
    return all(labels.get(k) == v for k, v in desired["metadata"]["labels"].items())


#: A provider outage that leaves an ExchangeRate without any rate is retried this often (the
#: scheduled refresh, hourly by default, is too late for a rate that was never written).
RETRY_UNFILLED_SECONDS = 60.0


def is_converged(cr: Obj, cm: Obj | None) -> bool:
    """Has this generation already been fetched and written, with the ConfigMap in place?

    Then an ExchangeRate event needs no provider request: our own status writes come back
    as update events, and a restarted watcher re-sends "add" for every ExchangeRate.
    Keeping the rate fresh is the scheduled refresh's job.
    """
    meta, status = cr["metadata"], cr.get("status") or {}
    if status.get("observedGeneration") != meta.get("generation"):
        return False
    ready = get_condition(status, "Ready")
    if ready is None or ready.get("status") != "True":
        return False
    if cm is None or not is_owned_by(cm, meta["uid"]):
        return False
    data = cm.get("data") or {}
    return (data.get("base") == base_of(cr) and data.get("currency") == currency_of(cr)
            and data.get("rate") == status.get("rate"))


def written_ahead(cr: Obj, cm: Obj | None, now: str, within: float) -> bool:
    """Does ``cm`` hold an answer for this spec that the status does not hold yet, or the
    status one the cached ``cm`` does not, fetched less than ``within`` seconds before
    ``now``? Then this run sees another router replica's run half-way through its two
    writes (their events can reach this replica's cache in either order), and would ask the
    provider for what the other has just asked.

    Only a recent ``fetchedAt`` counts, never one after ``now``: a ConfigMap edited by hand
    with a recent one is put back at most ``within`` seconds later, one dated in the future
    at once."""
    if cm is None or not is_ours(cm, cr):
        return False
    data = cm.get("data") or {}
    status = cr.get("status") or {}
    wanted = (base_of(cr), currency_of(cr))
    if (status.get("base"), status.get("currency")) == wanted \
            and str(status.get("lastSuccessfulFetch") or "") > written_at(cm):
        # the other order: its status came first, its ConfigMap write is on the way
        fetched = str(status["lastSuccessfulFetch"])
    elif (data.get("base"), data.get("currency")) == wanted \
            and written_at(cm) > decided_at(cr):
        fetched = written_at(cm)
    else:
        return False
    if fetched > now:
        return False
    try:
        fetched_at, now_at = parse_rfc3339(fetched), parse_rfc3339(now)
    except ValueError:
        return False
    return fetched_at is not None and now_at is not None \
        and (now_at - fetched_at).total_seconds() < within


def written_at(cm: Obj | None) -> str:
    """When the answer ``cm`` holds was fetched (its ``fetchedAt``; "" if none)."""
    return str(((cm or {}).get("data") or {}).get("fetchedAt") or "")


def decided_at(cr: Obj) -> str:
    """When the status of ``cr`` was last decided (RFC 3339; "" if never): its last
    successful fetch, or the last change of its Ready condition, whichever is later. A
    provider answer older than that is older than what the status already says."""
    status = cr.get("status") or {}
    ready = get_condition(status, "Ready") or {}
    return max(str(status.get("lastSuccessfulFetch") or ""),
               str(ready.get("lastTransitionTime") or ""))


def good_since(cr: Obj, cm: Obj | None) -> str:
    """When good news about ``cr`` was last known (RFC 3339; "" if never): its last
    successful fetch, its ``Ready=True`` (a stale answer keeps the held rate good), or its
    ConfigMap's ``fetchedAt`` (another replica writes that first). A provider failure older
    than that is not worth reporting; one newer than a failure status is the same news."""
    status = cr.get("status") or {}
    ready = get_condition(status, "Ready") or {}
    return max(str(status.get("lastSuccessfulFetch") or ""), written_at(cm),
               str(ready.get("lastTransitionTime") or "") if ready.get("status") == "True"
               else "")


def desired(cr: Obj, cm: Obj | None, answer: Quote | ProviderError | None, now: str) -> Desired:
    """The ConfigMap and status for ``cr``, whose ConfigMap is ``cm`` (as cached), given the
    provider's ``answer`` (None: nothing new to write, the ExchangeRate is converged)."""
    if answer is None:
        return Desired(prune=False, summary=f"ExchangeRate {_name(cr)} generation "
                       f"{cr['metadata'].get('generation')} already written; the refresh "
                       "keeps it fresh")
    if isinstance(answer, ProviderError):
        kept = _kept(cr, cm)
        retry = answer.transient and not _has_rate(cr, cm) and kept is None
        message = answer.message
        if answer.transient:  # when it is asked again, in the status as in the log
            message += (f"; asking again in {RETRY_UNFILLED_SECONDS:g}s" if retry
                        else "; the next refresh tries again")
        return failed(cr, answer.reason, message, now, retry=retry, keep=kept)
    try:
        wanted = configmap_for(cr, answer)
    except ProviderError as exc:  # the answer lacks this currency
        return failed(cr, exc.reason, exc.message, now)
    if cm is not None and not is_ours(cm, cr):
        # (its deletion, which the message asks for, runs this ExchangeRate again)
        return failed(cr, "ConfigMapConflict", _taken(cr), now, blocked_by=cm)
    latest = latest_plausible(now)
    if answer.date > latest:
        return implausible(cr, cm, answer, now, latest)
    held = last_good(cr)
    if held is not None and answer.date < held.date <= latest:
        return stale(cr, cm, answer, held)
    data = wanted["data"]
    message = f"1 {data['base']} = {data['rate']} {data['currency']} on {data['date']}"
    ok = {
        "rate": data["rate"], "date": data["date"], "base": data["base"],
        "currency": data["currency"], "source": data["source"],
        "lastSuccessfulFetch": answer.fetched_at,
        **ready_status(cr, True, "RateFetched", message, answer.fetched_at),
    }

    def problem(outcome: Outcome) -> tuple[str, str] | None:
        if outcome.conflicts:  # someone made one at the name after the cache saw none
            return "ConfigMapConflict", _taken(cr)
        if outcome.refused:
            return "ConfigMapRefused", f"the API server refused {outcome.refused[0]}"
        return None

    def status(outcome: Outcome) -> Obj:
        found = problem(outcome)
        return ok if found is None else failed_status(cr, *found, now)

    def events(outcome: Outcome) -> list[Note]:
        found = problem(outcome)
        if found is not None:
            return [failure_note(*found)]
        return recovered_note(cr, message)

    return Desired([Child(wanted, mode="replace", matches=same_values)], status=status,
                   events=events, summary=f"ExchangeRate {_name(cr)}: {message}")


def failed(cr: Obj, reason: str, message: str, now: str, *, retry: bool = False,
           keep: Obj | None = None, blocked_by: Obj | None = None) -> Desired:
    """A failure reported on the ExchangeRate; its ConfigMap is only kept as ``keep`` (the
    last good answer, see :func:`last_good`) says, if given.

    ``retry``: ask again in :data:`RETRY_UNFILLED_SECONDS` (an outage that may pass, and no
    rate written yet: waiting for the hourly refresh would leave the ConfigMap missing for
    up to an hour). A rate already written stays until the refresh replaces it.

    ``blocked_by``: someone's ConfigMap at the name; its change or deletion runs the
    ExchangeRate again (it maps to no ExchangeRate by itself)."""
    children = [Child(keep, mode="replace", matches=same_values)] if keep else []
    return Desired(children, prune=False, status=failed_status(cr, reason, message, now),
                   blocked_by=[blocked_by] if blocked_by else [],
                   # (it says what the provider did, not what the written ConfigMap holds: a
                   # write-back needs no run after it, which would ask the provider again)
                   status_seen_before_writes=False,
                   events=[failure_note(reason, message)],
                   requeue_after=RETRY_UNFILLED_SECONDS if retry else None,
                   summary=f"ExchangeRate {_name(cr)}: {reason}: {message}")


#: The Ready reason while the provider answers with an older publication date than the rate
#: held (a lagging mirror or cache of it): the held rate is kept, and is still good.
STALE = "StaleAnswer"


def stale(cr: Obj, cm: Obj | None, answer: Quote, held: Quote) -> Desired:
    """The provider answered with an older ``date`` than the rate status holds: a rate never
    goes backwards. The held rate stays (the ConfigMap is written back from it if it was
    deleted or edited, as in an outage), and ``Ready`` stays True, since what the ConfigMap
    holds is still the newest rate known, with reason :data:`STALE` saying why the answer
    was not used. ``lastSuccessfulFetch`` does not move: the answer was not usable. The
    Warning Event is posted when the status changes, not at every refresh.

    Only status's date counts, never the ConfigMap's: anyone who can edit the ConfigMap could
    otherwise stop every update with a date far in the future. Nor does a status date after
    tomorrow (:func:`latest_plausible`; an older version wrote such answers): the caller
    lets the next real answer replace it."""
    currency = currency_of(cr)
    message = (f"1 {held.base} = {held.rate(currency)} {currency} on {held.date} kept: "
               f"{answer.source} answered with an older rate "
               f"({answer.rate(currency)} on {answer.date}); a rate never goes backwards")
    kept = _kept(cr, cm)
    return Desired([Child(kept, mode="replace", matches=same_values)] if kept else [],
                   prune=False, status_seen_before_writes=False,
                   status=ready_status(cr, True, STALE, message, answer.fetched_at),
                   events=[Note("Warning", STALE, message)],
                   summary=f"ExchangeRate {_name(cr)}: {STALE}: {message}")


#: The Ready reason for an answer dated after tomorrow (see :func:`implausible`).
IMPLAUSIBLE_DATE = "ImplausibleDate"


def latest_plausible(now: str) -> str:
    """The latest publication date a real answer can carry, given ``now`` (RFC 3339, UTC):
    tomorrow. The ECB publishes for the current day; the extra day is slack for a provider
    whose day starts before UTC's (and for a ``now`` from a clock a little behind)."""
    return (Date.fromisoformat(now[:10]) + timedelta(days=1)).isoformat()


def implausible(cr: Obj, cm: Obj | None, answer: Quote, now: str, latest: str) -> Desired:
    """The provider answered with a date after ``latest`` (tomorrow): not a rate (a broken
    mirror, a test double, a clock gone wrong). It is refused as a malformed answer is: the
    last good rate is kept (and written back if the ConfigMap lost it), ``Ready=False``.
    Writing it would be worse than an outage: "a rate never goes backwards" would then
    refuse every real answer until that date came."""
    message = (f"{answer.source} answered for {answer.base} with publication date "
               f"{answer.date}, after tomorrow ({latest}; today is {now[:10]} UTC); an answer "
               "from the future is not a rate: the last good rate is kept")
    return failed(cr, IMPLAUSIBLE_DATE, message, now, keep=_kept(cr, cm))


def last_good(cr: Obj) -> Quote | None:
    """The last good answer for this spec's base and currency, as status keeps it; None
    when status has none (never fetched, or written before status kept base, currency and
    source) or has one for another base or currency (the spec changed since)."""
    status = cr.get("status") or {}
    base, currency = base_of(cr), currency_of(cr)
    fields = [status.get(k) for k in ("rate", "date", "source", "lastSuccessfulFetch")]
    if not all(isinstance(f, str) and f for f in fields) \
            or (status.get("base"), status.get("currency")) != (base, currency):
        return None
    rate, date, source, fetched_at = (str(f) for f in fields)
    return Quote(base=base, date=date, rates={currency: rate}, source=source,
                 fetched_at=fetched_at)


def _kept(cr: Obj, cm: Obj | None) -> Obj | None:
    """The ConfigMap to keep while the provider fails: the last good answer's, unless the
    ConfigMap is someone else's or holds an answer newer than status (another replica's
    refresh wrote it; its status write is not cached yet)."""
    last = last_good(cr)
    if last is None or (cm is not None and not is_ours(cm, cr)):
        return None
    if written_at(cm) > last.fetched_at:
        return None
    return configmap_for(cr, last)


def _has_rate(cr: Obj, cm: Obj | None) -> bool:
    """Is a rate of this ExchangeRate's base and currency in its ConfigMap already?"""
    data = (cm or {}).get("data") or {}
    return bool(data.get("rate")) and data.get("base") == base_of(cr) \
        and data.get("currency") == currency_of(cr)


def failed_status(cr: Obj, reason: str, message: str, now: str) -> Obj:
    """``Ready=False`` with the reason; the last good answer (``rate``, ``date``,
    ``base``, ``currency``, ``source``, ``lastSuccessfulFetch``) stays in status (a merge
    patch leaves it)."""
    return ready_status(cr, False, reason, message, now)


def ready_status(cr: Obj, ready: bool, reason: str, message: str, at: str) -> Obj:
    """The status fields every outcome writes: ``observedGeneration`` and ``Ready``."""
    meta = cr["metadata"]
    return {
        "observedGeneration": meta.get("generation"),
        "conditions": set_condition(
            (cr.get("status") or {}).get("conditions"), "Ready", ready, reason, message, at,
            meta.get("generation")),
    }


def recovered_note(cr: Obj, message: str) -> list[Note]:
    """A Normal ``Recovered`` Event when a rate is fetched after failures had made the
    ExchangeRate not Ready (their Warnings said so; this says they are over). Posted with
    the status change only, so once."""
    before = get_condition(cr.get("status") or {}, "Ready") or {}
    if before.get("status") != "False":
        return []
    return [Note("Normal", "Recovered", f"{before.get('reason')} resolved: {message}")]


def failure_note(reason: str, message: str) -> Note:
    """A Warning at every failed attempt (not only when the status changes): the Event's
    count tells how many refreshes in a row failed."""
    return Note("Warning", reason, message, every_run=True)


def _taken(cr: Obj) -> str:
    return (f"ConfigMap {_name(cr)} exists and is not managed by this ExchangeRate; eventop "
            "leaves it alone: delete or rename it to let eventop manage it")


def _name(cr: Obj) -> str:
    return f"{cr['metadata']['namespace']}/{cr['metadata']['name']}"
