"""HTTP front of localkube: the Kubernetes REST paths, over a threaded HTTP/1.1 server.

Plain ``http.server`` (one thread per connection, keep-alive) rather than a WSGI stack:
watches need chunked streaming, and the fault injection needs the raw socket (to cut a
stream mid-way, or to keep it open and silent).
"""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

import yaml

from eventop.localkube import discovery, errors, openapi, protobuf
from eventop.localkube.errors import ApiError
from eventop.localkube.metadata import partial, partial_list, wrong_shape
from eventop.localkube.negotiate import PLAIN, View, view_for
from eventop.localkube.objects import dumps
from eventop.localkube.resources import ResourceType
from eventop.localkube.selectors import parse_selectors
from eventop.localkube.store import Obj
from eventop.localkube.tables import table
from eventop.localkube.watch import WatchStream

if TYPE_CHECKING:
    from eventop.localkube.core import LocalKube

MAX_BODY = 3 * 1024 * 1024
# Kinds whose registry answers DELETE with the object instead of a Status (ReturnDeletedObject).
RETURNS_DELETED = ("Namespace", "Pod", "Service", "PersistentVolumeClaim")
PATCH_TYPES = {"application/json-patch+json": "json", "application/merge-patch+json": "merge",
               "application/strategic-merge-patch+json": "merge",
               "application/apply-patch+yaml": "apply"}


class Server(ThreadingHTTPServer):
    """Keeps track of open connections so ``stop`` can close idle keep-alive sockets too."""

    daemon_threads = False
    block_on_close = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], owner: LocalKube) -> None:
        self.owner = owner
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()
        super().__init__(address, Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.connections_lock:
            self.connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.connections_lock:
            self.connections.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        with self.connections_lock:
            conns = list(self.connections)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are two writes: avoid 40 ms delayed ACKs
    server: Server

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the request log is ``LocalKube.requests``."""

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    # -- plumbing --------------------------------------------------------------------

    def setup(self) -> None:
        super().setup()
        # Small writes (headers, watch lines) must not wait for delayed ACKs (Nagle).
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    @property
    def kube(self) -> LocalKube:
        return self.server.owner

    def _serve(self, method: str) -> None:
        self.warnings: list[str] = []
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        try:
            raw = self._read_body()
            if self.kube.unavailable:
                raise errors.unavailable()
            result = self._route(method, url.path, query, raw)
            if result is None:  # a watch: logged and answered by _watch
                return
            status, body = result
        except ApiError as exc:
            status, body = exc.code, exc.status()
        except (ConnectionError, BrokenPipeError):
            self.close_connection = True
            return
        except Exception as exc:  # a bug in localkube: report it like the real server would
            status, body = 500, ApiError(
                500, "InternalError", f"localkube internal error: {type(exc).__name__}: {exc}",
                {}).status()
        # Logged before answering, so a client that got its answer finds it in the log.
        self.kube.requests.append((method, url.path, url.query, status))
        with contextlib.suppress(ConnectionError):
            self._send(status, body)

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            left = length
            while left > 0:  # drain it, so the client gets to read our answer
                chunk = self.rfile.read(min(left, 1 << 20))
                if not chunk:
                    break
                left -= len(chunk)
            raise ApiError(413, "RequestEntityTooLarge",
                           f"the request body of {length} bytes is larger than the "
                           f"{MAX_BODY} bytes an API server accepts", {})
        return self.rfile.read(length) if length else b""

    def _send(self, status: int, body: Any) -> None:
        data = body if isinstance(body, bytes) else json.dumps(
            body, separators=(",", ":")).encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8" if data == b"ok"
                         else "application/json")
        for warning in getattr(self, "warnings", []):
            self.send_header("Warning", '299 - "' + warning.replace('"', '\\"') + '"')
        self.send_header("Content-Length", str(len(data)))
        self._headers_buffer.append(b"\r\n" + data)  # headers and body in one write
        self.flush_headers()

    def _decode(self, raw: bytes, *, yaml_ok: bool = False) -> Any:
        ctype = (self.headers.get("Content-Type") or "application/json").split(";")[0].strip()
        if ctype == protobuf.CONTENT_TYPE:
            return protobuf.decode_request(raw)
        try:
            if yaml_ok or ctype in ("application/yaml", "application/apply-patch+yaml"):
                try:  # JSON is YAML, and parsed a hundred times faster
                    return json.loads(raw or b"{}")
                except ValueError:
                    return yaml.safe_load(raw)
            return json.loads(raw or b"{}")
        except (ValueError, yaml.YAMLError) as exc:
            raise errors.bad_request(f"the request body is not valid JSON/YAML: {exc}") from exc

    def _manager(self, query: dict[str, str]) -> str:
        if query.get("fieldManager"):
            return query["fieldManager"]
        agent = self.headers.get("User-Agent") or "unknown"
        return agent.split("/")[0][:128]

    # -- routing ---------------------------------------------------------------------

    def _route(self, method: str, path: str, query: dict[str, str],
               raw: bytes) -> tuple[int, Any] | None:
        parts = [p for p in path.split("/") if p]
        if method == "GET":
            simple = discovery.document(self.kube.store, parts, self.server.server_address[0])
            if simple is not None:
                return 200, simple
        if len(parts) >= 2 and parts[0] == "api":
            group, version, rest = "", parts[1], parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiError(404, "NotFound", "the server could not find the requested resource",
                           {})
        res, ns, name, sub = self._resolve(group, version, rest)
        store = self.kube.store
        dry = query.get("dryRun") == "All"
        manager = self._manager(query)
        if sub and (sub != "status" or not res.has_status or not name):
            raise ApiError(404, "NotFound", "the server could not find the requested resource",
                           {})
        if method == "GET":
            view = view_for(self.headers.get("Accept"))
            if name:
                return 200, _render(res, store.get(res, ns, name), view, query)
            if query.get("watch") in ("1", "true", "True"):
                self._watch(res, ns, query, view)
                return None
            return 200, self._list(res, ns, query, view)
        if method == "POST" and not name:
            body = self._decode(raw)
            if not isinstance(body, dict):
                raise errors.bad_request("the request body must be an object")
            self.warnings = openapi.check_fields(res, body, query.get("fieldValidation"))
            return 201, _out(res, store.create(res, ns, body, manager=manager, dry_run=dry))
        if method == "PUT" and name:
            body = self._decode(raw)
            if not isinstance(body, dict):
                raise errors.bad_request("the request body must be an object")
            self.warnings = openapi.check_fields(res, body, query.get("fieldValidation"))
            return 200, _out(res, store.update(res, ns, name, body, manager=manager,
                                          subresource=sub, dry_run=dry))
        if method == "PATCH" and name:
            ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
            if ctype not in PATCH_TYPES:
                raise errors.unsupported_media_type(ctype)
            ptype = PATCH_TYPES[ctype]
            body = self._decode(raw, yaml_ok=ptype == "apply")
            if ptype != "json":  # a merge or apply patch has the shape of the object
                self.warnings = openapi.check_fields(res, body,
                                                     query.get("fieldValidation"))
            obj, created = store.patch(
                res, ns, name, ptype, body, manager=query.get("fieldManager", "")
                if ptype == "apply" else manager, subresource=sub,
                force=query.get("force") in ("true", "1"), dry_run=dry)
            return (201 if created else 200), _out(res, obj)
        if method == "DELETE" and name:
            return self._delete(res, ns, name, query, raw, dry)
        if method == "DELETE":
            return self._delete_collection(res, ns, query)
        raise errors.method_not_allowed()

    def _resolve(self, group: str, version: str,
                 rest: list[str]) -> tuple[ResourceType, str | None, str, str]:
        table = self.kube.store.table
        not_found = ApiError(404, "NotFound", "the server could not find the requested resource",
                             {})
        with self.kube.store.lock:
            if len(rest) >= 3 and rest[0] == "namespaces":
                res = table.by_path(group, version, rest[2])
                if res is not None and res.namespaced and len(rest) <= 5:
                    return res, rest[1], (rest[3] if len(rest) > 3 else ""), \
                        (rest[4] if len(rest) > 4 else "")
            if not rest or len(rest) > 3:
                raise not_found
            res = table.by_path(group, version, rest[0])
        if res is None or (res.namespaced and len(rest) > 1):
            raise not_found
        return res, None, (rest[1] if len(rest) > 1 else ""), (rest[2] if len(rest) > 2 else "")

    # -- verbs -----------------------------------------------------------------------

    def _list(self, res: ResourceType, ns: str | None, query: dict[str, str],
              view: View = PLAIN) -> bytes:
        match = parse_selectors(res.kind, query)
        limit = int(query.get("limit") or 0)
        start, list_rv = None, None
        if query.get("continue"):
            try:
                token = json.loads(base64.urlsafe_b64decode(query["continue"].encode()))
                start, list_rv = tuple(token["start"]), int(token["rv"])
            except (ValueError, KeyError, TypeError) as exc:
                raise errors.bad_request(f"invalid continue token: {exc}") from exc
        items, rv, last, remaining = self.kube.store.list(res, ns, match, limit=limit,
                                                          start_after=start)  # type: ignore
        list_rv = list_rv or rv
        meta: Obj = {"resourceVersion": str(list_rv)}
        if last is not None:
            meta["continue"] = base64.urlsafe_b64encode(json.dumps(
                {"rv": list_rv, "start": list(last)}).encode()).decode()
            if match is None:
                meta["remainingItemCount"] = remaining
        if view.kind == "PartialObjectMetadataList":
            return _json(partial_list(items, meta, view.api_version))
        if view.kind == "PartialObjectMetadata":
            raise wrong_shape(view.kind, res, is_list=True)
        if view.kind == "Table":
            return _json(table(res, items, meta, view, query.get("includeObject", "Metadata")))
        if last is None and res.custom:
            meta["continue"] = ""
        if res.custom:  # unstructured: keys sorted, as the recordings show
            body = ",".join(dumps(i, True) for i in items)
            text = (f'{{"apiVersion":"{res.api_version}","items":[{body}],'
                    f'"kind":"{res.list_kind}","metadata":{dumps(meta, True)}}}')
        else:
            head = dumps({"kind": res.list_kind, "apiVersion": res.api_version,
                          "metadata": meta}, False)[:-1]
            body = ",".join(dumps({k: v for k, v in i.items() if k not in ("kind", "apiVersion")},
                                  False) for i in items)
            text = f'{head},"items":[{body}]}}'
        return text.encode()

    def _delete(self, res: ResourceType, ns: str | None, name: str, query: dict[str, str],
                raw: bytes, dry: bool) -> tuple[int, Any]:
        options = self._decode(raw) if raw else {}
        if not isinstance(options, dict):
            options = {}
        pre = options.get("preconditions") or {}
        propagation = options.get("propagationPolicy") or query.get("propagationPolicy") \
            or ("Orphan" if options.get("orphanDependents") else "Background")
        obj, gone = self.kube.store.delete(res, ns, name, uid=pre.get("uid"),
                                           resource_version=pre.get("resourceVersion"),
                                           propagation=propagation, dry_run=dry)
        if gone and res.kind not in RETURNS_DELETED:
            details: Obj = {"name": name}
            if res.group:
                details["group"] = res.group
            details.update({"kind": res.plural, "uid": obj["metadata"].get("uid")})
            return 200, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                         "status": "Success", "details": details}
        return 200, _out(res, obj)

    def _delete_collection(self, res: ResourceType, ns: str | None,
                           query: dict[str, str]) -> tuple[int, Any]:
        items, _, _, _ = self.kube.store.list(res, ns, parse_selectors(res.kind, query))
        for item in items:
            meta = item["metadata"]
            try:
                self.kube.store.delete(res, meta.get("namespace"), meta["name"])
            except ApiError:
                continue
        return 200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}

    # -- watch -----------------------------------------------------------------------

    def _watch(self, res: ResourceType, ns: str | None, query: dict[str, str],
               view: View) -> None:
        WatchStream(self, res, ns, query, view).serve()

    def chunk(self, data: bytes) -> None:
        """Write one HTTP chunk (b"" is the terminating chunk)."""
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def abort(self) -> None:
        """Cut the connection mid-stream, with no terminating chunk (a broken watch)."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)


def _out(res: ResourceType, obj: Obj) -> bytes:
    return dumps(obj, res.custom).encode()


def _json(obj: Obj) -> bytes:
    """A meta.k8s.io answer (typed: keys in field order, not sorted)."""
    return dumps(obj, False).encode()


def _render(res: ResourceType, obj: Obj, view: View, query: dict[str, str]) -> bytes:
    """One object as ``view`` asks: itself, its PartialObjectMetadata, or a one-row Table."""
    if view.kind == "PartialObjectMetadata":
        return _json(partial(obj, view.api_version))
    if view.kind == "PartialObjectMetadataList":
        raise wrong_shape(view.kind, res, is_list=False)
    if view.kind == "Table":
        meta = {"resourceVersion": obj["metadata"].get("resourceVersion", "")}
        return _json(table(res, [obj], meta, view, query.get("includeObject", "Metadata")))
    return _out(res, obj)


