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
long. A run's own fetch is not kept: asking again on the next change is what a user who
just fixed the network expects. All of it is per process and only an optimisation of the
request count: a run that finds no answer asks for itself.

Being per process, a kept answer can be older than what another process has already
written in the ExchangeRate's status (another router replica or worker refreshed since, and
the provider answered it otherwise). Such an answer is not used for that ExchangeRate
(``not_before``: the later of its status's last decision and its ConfigMap's ``fetchedAt``,
which another replica writes first): its run asks the provider itself rather than write
back the older news.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from eventop.handlers.exchange_rates import provider
from eventop.handlers.exchange_rates.provider import FrankfurterClient, ProviderError, Quote
from eventop.kube import now_rfc3339

#: Seconds a refresh's answers serve the runs it caused.
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


class Answers:
    """The answers of the last refresh, per base currency, for one provider client."""

    def __init__(self, client: FrankfurterClient, *, ttl: float = TTL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.ttl = ttl
        self.clock = clock
        self._by_base: dict[str, Answer] = {}
        self._lock = threading.Lock()

    def refresh(self, wanted: dict[str, set[str]]) -> None:
        """Ask once per base for its currencies (one budget for all); keep the answers."""
        deadline = self.client.clock() + self.client.refresh_budget
        for base, currencies in sorted(wanted.items()):
            result = self._ask(base, currencies, deadline)
            with self._lock:
                self._by_base[base] = Answer(frozenset(currencies), result, self.clock(),
                                             now_rfc3339())

    def recent(self, base: str, currency: str, not_before: str = "") -> Result | None:
        """A refresh's answer for ``currency`` in ``base``, if one is fresh and did not come
        before ``not_before`` (an RFC 3339 time: when the ExchangeRate's status was last
        decided, perhaps by another process)."""
        with self._lock:
            answer = self._by_base.get(base)
        if answer is None or currency not in answer.asked or \
                self.clock() - answer.at >= self.ttl or answer.when < not_before:
            return None
        return answer.result

    def fetch(self, base: str, currency: str) -> Result:
        """Ask now, for one ExchangeRate (within the client's own budget)."""
        return self._ask(base, {currency}, None)

    def _ask(self, base: str, currencies: set[str], deadline: float | None) -> Result:
        try:
            return self.client.latest(base, currencies, deadline=deadline)
        except ProviderError as exc:
            return exc


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
