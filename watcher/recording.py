"""Read recorded API traffic: what ``python -m eventop.watcher record`` writes.

A recording is, per resource, one ``<name>.list.json`` (the LIST response: the initial state)
and one ``<name>.watch.jsonl`` (the watch stream that followed, one event per line exactly as the
server sent it). Several resources recorded together are merged back into one timeline by
resourceVersion, which the API server draws from one etcd revision counter: that is the order in
which the changes really happened.

What is skipped, and why: ``BOOKMARK`` lines carry no change (only a resourceVersion);
``ERROR`` lines (such as the 410 Expired of ``watch-expired/``) are a failed watch, not a change,
so :func:`load_recording` leaves them out and logs a warning naming the file and the Status; a
line that is not valid JSON (a stream cut mid-line) is skipped with a warning too.
:func:`read_watch_file` yields every line, ERROR included, for callers that want them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from eventop.kube.reflector import WATCH_TYPE_TO_CHANGE, parse_watch_line

log = logging.getLogger("eventop.watcher.recording")

Obj = dict[str, Any]
PathLike = str | Path


def _files(paths: PathLike | Iterable[PathLike], suffixes: tuple[str, ...]) -> list[Path]:
    """Expand directories into their files with one of ``suffixes``, in name order."""
    if isinstance(paths, str | Path):
        paths = [paths]
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(sorted(f for f in p.iterdir() if f.name.endswith(suffixes)))
        elif p.exists():
            if p.name.endswith(suffixes):
                out.append(p)
        else:
            raise FileNotFoundError(f"recording {p} does not exist")
    return out


def watch_files(paths: PathLike | Iterable[PathLike]) -> list[Path]:
    """The watch files (``*.jsonl``) :func:`load_recording` would read from ``paths``."""
    return _files(paths, (".jsonl",))


def read_watch_file(path: PathLike) -> Iterator[tuple[str, Obj]]:
    """Every decodable line of a watch stream as (watch type, object): ERROR and BOOKMARK too."""
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield parse_watch_line(line)
            except ValueError as exc:
                log.warning("skipping undecodable line %s:%d (%s)", path, lineno, exc)


def _rv_key(obj: Obj) -> int:
    rv = str((obj.get("metadata") or {}).get("resourceVersion") or "")
    return int(rv) if rv.isdigit() else -1


def load_recording(paths: PathLike | Iterable[PathLike]) -> list[tuple[str, Obj]]:
    """The changes of all given watch files and directories, as (change, object).

    ``change`` is ``add``/``update``/``delete`` (ADDED/MODIFIED/DELETED). Events are merged in
    resourceVersion order (a stable sort, so events of one file keep their order; a
    non-numeric resourceVersion sorts first). BOOKMARK and ERROR lines are skipped (see the
    module docstring).
    """
    events: list[tuple[str, Obj]] = []
    for f in watch_files(paths):
        for wtype, obj in read_watch_file(f):
            change = WATCH_TYPE_TO_CHANGE.get(wtype)
            if change is not None:
                events.append((change, obj))
            elif wtype == "ERROR":
                log.warning("recording %s holds an ERROR event (a failed watch, not a change): "
                            "%s %s: %s", f, obj.get("code"), obj.get("reason"),
                            obj.get("message"))
            elif wtype != "BOOKMARK":
                log.warning("recording %s: unknown watch event type %r skipped", f, wtype)
    events.sort(key=lambda e: _rv_key(e[1]))
    return events


def items_of_list(doc: Obj) -> list[Obj]:
    """The items of a LIST response, with the apiVersion and kind the server leaves out."""
    api_version = str(doc.get("apiVersion") or "")
    list_kind = str(doc.get("kind") or "")
    kind = list_kind[:-4] if list_kind.endswith("List") else list_kind
    items = []
    for item in doc.get("items") or []:
        item = dict(item)
        item.setdefault("apiVersion", api_version)
        item.setdefault("kind", kind)
        items.append(item)
    return items


def load_initial(paths: PathLike | Iterable[PathLike]) -> list[Obj]:
    """The items of every ``*.list.json`` given (or found in the given directories)."""
    out: list[Obj] = []
    for f in _files(paths, (".list.json",)):
        with open(f, encoding="utf-8") as fh:
            out.extend(items_of_list(json.load(fh)))
    return out
