"""Every ``EVENTOP_*`` environment variable, and the check that refuses a misspelt one.

A flag mistyped on the command line is refused by argparse; a variable mistyped in a
Deployment's ``env`` would be read by nobody, and the process would start as if it were
unset: ``EVENTOP_ROUTR_TOKEN`` leaves the router open to anyone, ``EVENTOP_BUILTIN_HANDLER``
lets every shipped handler act on the whole cluster. So every eventop command refuses an
``EVENTOP_*`` name it does not know, in one line that names the closest one it does.

One process may be given another's variables (``make demo`` starts the router and the
watcher from one environment; a platform team may share one ConfigMap of settings), so each
command accepts every name eventop reads anywhere, not only its own. Kubernetes adds
variables of its own under the same prefix: for a Service named ``eventop-router`` in the
namespace it sets ``EVENTOP_ROUTER_SERVICE_HOST``, ``EVENTOP_ROUTER_PORT`` and the like
(service links); they are recognised by the ``*_SERVICE_HOST`` that always comes with them.

Only the standard library is imported here (see :mod:`eventop.cli`).
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping

PREFIX = "EVENTOP_"

#: What the router, the watcher, the local API server and the demo read.
COMMANDS = frozenset({
    # the router (python -m eventop.router) and its handlers
    "EVENTOP_ANSWER_WAIT_SECONDS", "EVENTOP_BUILTIN_HANDLERS", "EVENTOP_CACHE_WAIT_SECONDS",
    "EVENTOP_HANDLERS", "EVENTOP_MAX_BODY_BYTES", "EVENTOP_ROUTER_TOKEN",
    "EVENTOP_RUN_ON_WATCH", "EVENTOP_THREADS",
    # every command
    "EVENTOP_KUBE_URL", "EVENTOP_LOG_FORMAT", "EVENTOP_LOG_LEVEL",
    # the watcher (python -m eventop.watcher)
    "EVENTOP_API_BACKOFF_MAX_SECONDS", "EVENTOP_BACKOFF_BASE_SECONDS",
    "EVENTOP_BACKOFF_MAX_SECONDS", "EVENTOP_DRAIN_SECONDS", "EVENTOP_KUBE_CONTEXT",
    "EVENTOP_LEADER_ELECT", "EVENTOP_LEASE_NAME", "EVENTOP_LEASE_NAMESPACE",
    "EVENTOP_LEASE_SECONDS", "EVENTOP_MAX_ATTEMPTS", "EVENTOP_MAX_ERROR_ATTEMPTS",
    "EVENTOP_MAX_IN_FLIGHT", "EVENTOP_METRICS_PORT", "EVENTOP_PAGE_SIZE",
    "EVENTOP_QUEUE_SIZE", "EVENTOP_READ_TIMEOUT_SECONDS", "EVENTOP_RENEW_DEADLINE_SECONDS",
    "EVENTOP_RESOURCES", "EVENTOP_RESYNC_SECONDS", "EVENTOP_RETRY_PERIOD_SECONDS",
    "EVENTOP_SINK_TIMEOUT_SECONDS", "EVENTOP_SOURCE", "EVENTOP_WATCH_TIMEOUT_SECONDS",
})

#: What the test suites and the benchmarks read (set around the commands they start).
TOOLING = frozenset({
    "EVENTOP_BENCH_KEEP_LOGS", "EVENTOP_BENCH_VERBOSE", "EVENTOP_FAULT_REPORT",
    "EVENTOP_RBAC_DEBUG", "EVENTOP_SHARED", "EVENTOP_TEST_CLUSTER_DIR",
    "EVENTOP_TEST_CLUSTER_SCRIPT", "EVENTOP_TEST_KUBECONFIG", "EVENTOP_TEST_RECORD",
})

KNOWN = COMMANDS | TOOLING

# What Kubernetes derives from a Service's name (docker-link style), after the name's prefix.
_SERVICE_LINK = re.compile(r"_(SERVICE_HOST|SERVICE_PORT(_\w+)?|PORT(_\d+_(TCP|UDP|SCTP)"
                           r"(_PROTO|_PORT|_ADDR)?)?)$")


def unknown(environ: Mapping[str, str] | None = None) -> list[str]:
    """The ``EVENTOP_*`` names in ``environ`` (default: this process's) that eventop does
    not read and Kubernetes did not set, sorted."""
    env = os.environ if environ is None else environ
    services = {name[:-len("_SERVICE_HOST")] for name in env
                if name.startswith(PREFIX) and name.endswith("_SERVICE_HOST")}
    found = []
    for name in env:
        if not name.startswith(PREFIX) or name in KNOWN:
            continue
        match = _SERVICE_LINK.search(name)
        if match and name[:match.start()] in services:
            continue
        found.append(name)
    return sorted(found)


def describe(names: list[str]) -> str:
    """One sentence saying what is wrong with ``names`` (from :func:`unknown`)."""
    parts = []
    for name in names:
        close = difflib.get_close_matches(name, sorted(COMMANDS), n=1, cutoff=0.75)
        parts.append(f"{name} (did you mean {close[0]}?)" if close else name)
    what = "environment variable" + ("" if len(names) == 1 else "s")
    return (f"{what} not read by eventop: {', '.join(parts)}; a misspelt name would be "
            "ignored, so nothing starts until it is corrected or removed")
