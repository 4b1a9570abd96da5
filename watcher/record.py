"""``watcher record``: save a live LIST and the watch that follows, exactly as the server sent
them, in the format ``watcher replay`` and :mod:`eventop.watcher.recording` read.

Per resource: ``<path>.list.json`` (the LIST: every page's items in one document, the last
page's metadata) and ``<path>.watch.jsonl`` (every watch line verbatim, BOOKMARK and ERROR
lines included). The list and watch are the reflector's, so a recording resumes a dropped
watch like everything else; a 410 re-list is not written again (the watch lines say what
happened).
"""

from __future__ import annotations

import copy
import json
import threading
import time
from pathlib import Path
from typing import IO, Any

from eventop.kube import Kube
from eventop.kube.reflector import Backoff, Reflector, Sink, WatchSettings
from eventop.watcher.specs import ResourceSpec

Obj = dict[str, Any]


def file_stem(path: str) -> str:
    return path.strip("/").replace("/", "_")


class RecordingSink(Sink):
    """Writes the first list and every watch line of one resource."""

    def __init__(self, spec: ResourceSpec, out: Path) -> None:
        self.spec = spec
        self.out = out
        self.lines = 0
        self._pages: list[Obj] | None = None
        self.stem = ""
        self._fh: IO[bytes] | None = None

    def begin_list(self, mode: str) -> None:
        self._pages = [] if self._fh is None else None  # only the first list is kept

    def raw_page(self, page: Obj) -> None:
        if self._pages is not None:
            self._pages.append(copy.deepcopy(page))

    def end_list(self, resource_version: str) -> None:
        if self._pages is None:
            return
        doc = self._pages[-1] if self._pages else {"items": []}
        doc["items"] = [item for page in self._pages for item in page.get("items") or []]
        (self.out / f"{self.stem}.list.json").write_text(json.dumps(doc, indent=1) + "\n")
        self._fh = open(self.out / f"{self.stem}.watch.jsonl", "wb")  # noqa: SIM115
        self._pages = None

    def raw_line(self, line: bytes) -> None:
        if self._fh is not None:
            self._fh.write(line + b"\n")
            self._fh.flush()
            self.lines += 1

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()


def record(kube: Kube, specs: list[ResourceSpec], out: Path, seconds: float) -> dict[str, int]:
    """List+watch every resource for ``seconds``; returns the watch lines saved per resource."""
    out.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    settings = WatchSettings(watch_timeout=max(1, int(seconds)), read_timeout=seconds + 10,
                             resync_seconds=0, backoff=Backoff(0.5, 5.0))
    sinks, loops = [], []
    for spec in specs:
        sink = RecordingSink(spec, out)

        def resolve(spec: ResourceSpec = spec, sink: RecordingSink = sink) -> Any:
            watched = spec.resolve(kube)
            sink.stem = file_stem(watched.resource.path(spec.namespace))
            return watched

        sinks.append(sink)
        loops.append(Reflector(kube, resolve, sink, settings, stop, name=str(spec)).start())
    time.sleep(seconds)
    stop.set()
    for loop in loops:
        loop.join(10)
    for sink in sinks:
        sink.close()
    return {str(sink.spec): sink.lines for sink in sinks}
