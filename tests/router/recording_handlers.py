"""Handlers for the router's process tests: each appends what it received to a file.

Loaded into ``python -m eventop.router`` through
``EVENTOP_HANDLERS=tests.router.recording_handlers`` (with ``EVENTOP_BUILTIN_HANDLERS=none``,
so only these run). Every call appends one JSON line to the file named by ``EVENTOP_TEST_RECORD``:
which handler ran, for which event id, in which worker process. One ``os.write`` on an ``O_APPEND``
file per line keeps lines from several workers whole.

Only the router processes import this module: importing it in the test process would add
these handlers to the process-wide registry that other test modules dispatch through.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any

from eventop.handlers import Event, on
from eventop.kube.errors import Unavailable
from tests.router.support import (
    FAIL_TYPE,
    HANDLER_FOR_KIND,
    KUBE_TYPE,
    RECORD_ENV,
    SLOW_TYPE,
    UNAVAILABLE_TYPE,
)

KUBE = "dev.knative.apiserver.*"


def record(handler: str, event: Event) -> str:
    ref = event.ref
    line = json.dumps({
        "handler": handler, "id": event.id, "type": event.type, "pid": os.getpid(),
        "kind": ref.kind if ref else None, "name": ref.name if ref else None,
        "namespace": ref.namespace if ref else None, "subject": event.subject,
        "time": event.time, "extensions": event.extensions,
        "data_type": type(event.data).__name__,
    }) + "\n"
    fd = os.open(os.environ[RECORD_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    return f"recorded by {handler}"


def _recorder(name: str) -> Callable[[Event, Any], str]:
    def handler(event: Event, kube: Any) -> str:
        return record(name, event)

    handler.__name__ = handler.__qualname__ = name  # the registry names it after this
    return handler


# One recording handler per kind of the recordings: tests.router.recording_handlers.<name>.
for (_api_version, _kind), _name in HANDLER_FOR_KIND.items():
    globals()[_name] = on(KUBE, api_version=_api_version, kind=_kind)(_recorder(_name))


@on(SLOW_TYPE)
def slow(event: Event, kube: Any) -> str:
    """Holds its worker a little, so concurrent events spread over the workers."""
    time.sleep(0.02)
    return record("slow", event)


@on(KUBE_TYPE)
def reads_the_api(event: Event, kube: Any) -> str:
    """Uses the worker's own Kubernetes connection, made lazily after gunicorn forked."""
    namespace = kube.get_or_none("v1", "Namespace", event.data["namespace"])
    return f"namespace {event.data['namespace']}: " + (
        f"uid {namespace['metadata']['uid']}" if namespace else "absent")


@on(FAIL_TYPE)
def fail(event: Event, kube: Any) -> None:
    raise RuntimeError(f"deliberate test failure for {event.id}")


@on(UNAVAILABLE_TYPE)
def unavailable(event: Event, kube: Any) -> None:
    raise Unavailable("Kubernetes API unreachable (simulated by the test handler)")
