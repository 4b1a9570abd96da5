"""Where the rates provider is asked: the ExchangeRate handler's one piece of I/O, kept out of
its pure function (:mod:`.desired`).

The engine's contract is a pure function from an ExchangeRate and the cache to what should
exist. A rate is an input the cache can not hold (it is not a Kubernetes object), so it is
fetched before the function runs, in two places:

* **the scheduled refresh** (``@triggers``, in the package): the trigger lists every
  ExchangeRate from the cache and calls :meth:`Answers.refresh`, which asks the provider
  ONCE PER BASE currency, for every currency wanted in that base, under one time budget
  shared by all bases (with the provider down, the refresh still answers within the
  router's worker timeout); the answers, failures included, are kept here. The trigger
  then names every ExchangeRate for a run, and each run takes its base's answer from here
  (:meth:`Answers.recent`): N ExchangeRates of one base cost one request, however the
  engine schedules and merges their runs;
* **an ExchangeRate changed** (a new one, a new spec, its ConfigMap deleted by hand): unless
  this generation is already written (then nothing is asked: our own status writes and a
  restarted watcher's "add" events cost no request), its run asks for its own currency at
  once (:meth:`Answers.fetch`), unless a refresh answered for it moments ago.

Answers are kept :data:`TTL` seconds: long enough for the runs a refresh queues, short
enough that an ExchangeRate changed after a failed refresh is not told of that failure for
long. Within that window nothing asks the provider again for a base it has just answered
(or failed) for:

* a refresh delivered again (the router answered 5xx while the API server was down, and the
  sender retried) reuses the answers of the first delivery instead of asking again;
* a failure, whether a refresh or a run's own fetch met it, is kept too, and every run of
  that base reuses it: during an outage each run would otherwise spend the client's
  retries for itself (status changes, new ExchangeRates, the every-minute retry of those
  without a rate), an outage costing requests per ExchangeRate instead of per base. An
  outage (unreachable, 5xx, rate limited) answers for every currency of its base; a
  rejection or a malformed answer only for the currencies it was asked for, so a spec that
  fixes a currency is asked at once. The every-minute retry comes after the window, so a
  provider that is back is seen within about a minute;
* runs of one base that ask while a request for it is in flight wait for that one, once,
  and use its answer if it serves them (an outage does); no lock is held while asking, so
  runs of a base's currencies that succeed ask side by side.

A run's own successful fetch is not kept (it asked for one currency only, and the next
change of an ExchangeRate is answered by a fresh request). All of it is per process and
only an optimisation of the request count: a run that finds no answer asks for itself.

Being per process, a kept answer can be older than what another process has already
written in the ExchangeRate's status (another router replica or worker refreshed since, and
the provider answered it otherwise). Such an answer is not used for that ExchangeRate
(``not_before``: the later of its status's last decision and its ConfigMap's ``fetchedAt``,
which another replica writes first): its run asks the provider itself rather than write
back the older news. A kept failure only yields to good news after it (``failure_not_before``:
a successful fetch, a ``Ready=True``, a ConfigMap write): a failure status decided after it
(this process's own report of it, most often) says nothing newer than the failure itself.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from eventop.handlers.exchange_rates import provider
from eventop.handlers.exchange_rates.provider import (
    FrankfurterClient,
    ProviderError,
    ProviderRateLimited,
    ProviderUnavailable,
    Quote,
    not_asked,
)
from eventop.kube import now_rfc3339

#: Seconds an answer or a failure serves the runs (and refreshes) that come after it.
TTL = 60.0

Result = Quote | ProviderError


@dataclass(frozen=True)
class Answer:
    """The provider's answer (or failure) for one base, and which currencies were asked."""

    asked: frozenset[str]
    result: Result
    at: float
    #: When it came, as status records times (RFC 3339, seconds, UTC).
    when: str

    def serves(self, currencies: set[str] | frozenset[str]) -> bool:
        """Does it answer for all of ``currencies``? An outage does for any currency of its
        base; an answer, a rejection or a malformed answer only for the ones asked."""
        if isinstance(self.result, (ProviderUnavailable, ProviderRateLimited)):
            return True
        return currencies <= self.asked


class Answers:
    """The answers of the last refresh, and the last failure, per base currency, for one
    provider client."""

    def __init__(self, client: FrankfurterClient, *, ttl: float = TTL,
                 clock: Callable[[], float] | None = None) -> None:
        self.client = client
        self.ttl = ttl
        #: The client's clock unless told otherwise (tests move one clock for both).
        self.clock = clock or client.clock
        self._refreshed: dict[str, Answer] = {}
        self._failed: dict[str, Answer] = {}
        #: The request for a base under way, if any: set once it is answered and kept.
        self._flights: dict[str, threading.Event] = {}
        #: When a refresh last asked the provider for each base (the clock's time).
        self._asked: dict[str, float] = {}
        self._lock = threading.Lock()

    def refresh(self, wanted: dict[str, set[str]]) -> list[str]:
        """Ask once per base for its currencies (one budget for all); keep the answers.

        A base answered (or failed) within :attr:`ttl` for all its currencies is not asked
        again (see the module docstring). Returns the bases the provider was asked for."""
        deadline = self.client.clock() + self.client.refresh_budget
        asked: list[str] = []
        # The base asked longest ago first: with a provider so slow that the budget runs out,
        # the bases left out this time are the first asked next time, never the same ones.
        for base, currencies in sorted(wanted.items(),
                                       key=lambda item: (self._asked.get(item[0], 0.0), item)):
            if _answered(self._latest(base, currencies, "", "")):
                continue
            # a refresh delivered twice at once asks once: the second waits for the first
            with self._flight(base) as mine:
                if not mine:
                    self._wait_for_flight(base)
                    if _answered(self._latest(base, currencies, "", "")):
                        continue
                result = self._ask(base, currencies, deadline)
                if not not_asked(result):
                    self._asked[base] = self.clock()
                asked.append(base)
                self._keep(self._refreshed, base, currencies, result)
        return asked

    def recent(self, base: str, currency: str, not_before: str = "",
               failure_not_before: str | None = None, *,
               run_failures: bool = True) -> Result | None:
        """A kept answer for ``currency`` in ``base``, if one is fresh and did not come
        before ``not_before`` (an RFC 3339 time: when the ExchangeRate's status was last
        decided, perhaps by another process); a kept failure, if fresh and not before
        ``failure_not_before`` (default ``not_before``: the last good news the status
        holds). Of several, the latest. Without ``run_failures``, only what a refresh got:
        a failure another ExchangeRate's own fetch met concerns only runs that would ask
        (a converged ExchangeRate run by a label edit is not told of an outage that no
        request for it met)."""
        answer = self._latest(base, {currency}, not_before,
                              not_before if failure_not_before is None else failure_not_before,
                              run_failures=run_failures)
        return None if answer is None else answer.result

    def fetch(self, base: str, currency: str, not_before: str = "",
              failure_not_before: str | None = None) -> Result:
        """Ask now, for one ExchangeRate (within the client's own budget), unless a request
        for the same base is in flight: then wait for it once, and take its failure (an
        outage answers for every currency of the base); a success for other currencies
        does not serve, and this run asks for itself. No lock is held while asking: runs of
        different currencies that succeed ask side by side (a slow provider must not queue
        a base's new ExchangeRates one behind the other, each holding a router thread)."""
        with self._flight(base) as mine:
            if not mine:
                self._wait_for_flight(base)
            found = self.recent(base, currency, not_before, failure_not_before)
            if found is not None:
                return found
            result = self._ask(base, {currency}, None)
            if isinstance(result, ProviderError):
                self._keep(self._failed, base, {currency}, result)
            return result

    @contextlib.contextmanager
    def _flight(self, base: str) -> Iterator[bool]:
        """Registers this thread's request for ``base`` as the one in flight (True), unless
        another one is (False: the caller waits for it with :meth:`_wait_for_flight`)."""
        with self._lock:
            mine = base not in self._flights
            if mine:
                self._flights[base] = threading.Event()
        try:
            yield mine
        finally:
            if mine:
                with self._lock:
                    done = self._flights.pop(base)
                done.set()

    def _wait_for_flight(self, base: str) -> None:
        with self._lock:
            flight = self._flights.get(base)
        if flight is not None:
            flight.wait(self.client.refresh_budget)

    def _latest(self, base: str, currencies: set[str], not_before: str,
                failure_not_before: str, *, run_failures: bool = True) -> Answer | None:
        now = self.clock()
        with self._lock:
            kept = [self._refreshed.get(base), self._failed.get(base) if run_failures else None]
        usable = [a for a in kept if a is not None and now - a.at < self.ttl
                  and a.serves(currencies)
                  and a.when >= (failure_not_before if isinstance(a.result, ProviderError)
                                 else not_before)]
        return max(usable, key=lambda a: a.at, default=None)

    def _keep(self, where: dict[str, Answer], base: str, currencies: set[str],
              result: Result) -> None:
        with self._lock:
            where[base] = Answer(frozenset(currencies), result, self.clock(), now_rfc3339())

    def _ask(self, base: str, currencies: set[str], deadline: float | None) -> Result:
        try:
            return self.client.latest(base, currencies, deadline=deadline)
        except ProviderError as exc:
            return exc


def _answered(answer: Answer | None) -> bool:
    """A kept answer a refresh need not ask again for: not one that says the base was not
    asked at all (a refresh within the minute, a redelivered one, asks it)."""
    return answer is not None and not not_asked(answer.result)


_answers: Answers | None = None
_answers_lock = threading.Lock()


def answers() -> Answers:
    """The answers of this process, for the configured provider (new when it changes)."""
    global _answers
    client = provider.get_client()
    with _answers_lock:
        if _answers is None or _answers.client is not client:
            _answers = Answers(client)
        return _answers
