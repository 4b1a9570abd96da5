"""eventop.kube.Kube against the local API server over HTTP: discovery-based CRD wait and
error mapping."""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections import Counter

import pytest

from eventop.kube import Kube, NotFound, Unavailable
from eventop.kube.errors import Conflict, Forbidden
from eventop.kube.metrics import KUBE_REQUESTS
from eventop.localkube import LocalKube

EVENTOP_KINDS = {("eventop.dev/v1", "CopyRule"), ("eventop.dev/v1", "ExchangeRate"),
                 ("eventop.dev/v1", "RegistryMirror")}


def test_missing_kinds_is_empty_once_the_crds_are_served(kube: Kube) -> None:
    assert kube.missing_kinds(EVENTOP_KINDS | {("v1", "ConfigMap")}) == []


def test_missing_kinds_names_every_kind_whose_crd_is_not_installed(tmp_path) -> None:
    with LocalKube(crd_dir=str(tmp_path)) as server:
        kube = Kube.connect(url=server.url)
        assert kube.missing_kinds(EVENTOP_KINDS | {("apps/v1", "StatefulSet")}) == [
            "CopyRule.eventop.dev/v1", "ExchangeRate.eventop.dev/v1",
            "RegistryMirror.eventop.dev/v1"]


def test_get_of_a_missing_object_raises_not_found_with_the_server_message(kube: Kube) -> None:
    with pytest.raises(NotFound, match='configmaps "nope" not found'):
        kube.get("v1", "ConfigMap", "nope", "default")


def test_unreachable_api_server_is_unavailable_naming_the_host_and_why_in_a_few_words() -> None:
    """Not urllib3's chain of pools, URLs and object reprs: that line is repeated for every
    kind on every retry while the API server is down."""
    kube = Kube.connect(url="http://127.0.0.1:9")
    with pytest.raises(Unavailable) as refused:
        kube.ping()
    assert str(refused.value) == ("version /version: Kubernetes API unreachable at "
                                  "http://127.0.0.1:9: connection refused")
    kube = Kube.connect(url="http://no-such-host.invalid:6443")
    with pytest.raises(Unavailable, match=r"unreachable at http://no-such-host\.invalid:6443: "
                                          r"cannot resolve host 'no-such-host\.invalid'"):
        kube.ping()


class _BrokenAnswer:
    """A server that answers one request with headers promising 100 bytes, then sends 10
    and either closes the connection or stalls past the client's read timeout; or
    ("garbled") sends a whole body that is not JSON."""

    def __init__(self, mode: str) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1)
        self.mode = mode
        self.done = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        conn.recv(65536)
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
        if self.mode == "garbled":  # whole, but not JSON (a proxy's error page, say)
            conn.sendall(head + b"10\r\n\r\nnot json!!")
        else:
            conn.sendall(head + b'100\r\n\r\n{"kind":"C')
        if self.mode == "stall":
            self.done.wait(5)
        conn.close()
        self.sock.close()


@pytest.mark.parametrize("mode", ["cut", "stall"])
def test_an_answer_that_breaks_off_after_its_headers_is_unavailable(mode: str) -> None:
    """The client reads a body only after the headers: a connection cut, or a read timeout,
    in the middle of it is the same passing fault as one before them (a 503 for the event,
    retried), never an unexpected exception (a 500, given up)."""
    server = _BrokenAnswer(mode)
    try:
        kube = Kube.connect(url=server.url)
        kube.timeout = (1.0, 0.5)
        with pytest.raises(Unavailable, match="broke off"):
            kube.get("v1", "ConfigMap", "x", "default")
    finally:
        server.done.set()


def test_an_answer_that_is_not_json_is_unavailable() -> None:
    server = _BrokenAnswer("garbled")
    kube = Kube.connect(url=server.url)
    kube.timeout = (1.0, 1.0)
    with pytest.raises(Unavailable, match="is not JSON"):
        kube.get("v1", "ConfigMap", "x", "default")


def test_event_about_an_object_with_a_253_character_name_is_recorded(kube: Kube) -> None:
    """An Event's name is the object's name plus a suffix, and must itself stay a valid
    name of at most 253 characters."""
    name = ("a" * 62 + ".") * 3 + "b" * 46 + "-" + "c" * 17  # cut before the hash: at "-"
    assert len(name) == 253
    cm = kube.create({"apiVersion": "v1", "kind": "ConfigMap",
                      "metadata": {"name": name, "namespace": "default"}})
    kube.post_event(cm, "Warning", "Testing", "twice")
    kube.post_event(cm, "Warning", "Testing", "twice")
    events = [e for e in kube.list("v1", "Event", "default")
              if e["involvedObject"]["name"] == name]
    assert [e["count"] for e in events] == [2]
    assert len(events[0]["metadata"]["name"]) <= 253


def test_an_event_posted_again_by_several_writers_at_once_counts_every_repeat(
        kube: Kube) -> None:
    """Two router replicas recording the same repeat at once: each count is a
    patch of the version it read, so none is lost."""
    cm = kube.create({"apiVersion": "v1", "kind": "ConfigMap",
                      "metadata": {"name": "counted-event", "namespace": "default"}})
    kube.post_event(cm, "Warning", "Testing", "again")

    def post_five() -> None:
        for _ in range(5):
            kube.post_event(cm, "Warning", "Testing", "again")

    threads = [threading.Thread(target=post_five) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    events = [e for e in kube.list("v1", "Event", "default")
              if e["involvedObject"]["name"] == "counted-event"]
    assert [e["count"] for e in events] == [11]


def test_a_repeat_of_an_event_this_process_posted_is_one_patch(kube: Kube) -> None:
    """As client-go's recorder: a failed refresh reports a Warning on every ExchangeRate,
    and each repeat cost a create refused 409, a read and a patch (3 requests, not 1)."""
    cm = kube.create({"apiVersion": "v1", "kind": "ConfigMap",
                      "metadata": {"name": "repeated-event", "namespace": "default"}})
    kube.post_event(cm, "Warning", "Testing", "again")
    before = _requests()
    kube.post_event(cm, "Warning", "Testing", "again")
    kube.post_event(cm, "Warning", "Testing", "again")
    assert _requests() - before == Counter({("patch", "events", "200"): 2})
    [event] = [e for e in kube.list("v1", "Event", "default")
               if e["involvedObject"]["name"] == "repeated-event"]
    assert event["count"] == 3
    kube.delete("v1", "Event", event["metadata"]["name"], "default")  # expired
    kube.post_event(cm, "Warning", "Testing", "again")
    [event] = [e for e in kube.list("v1", "Event", "default")
               if e["involvedObject"]["name"] == "repeated-event"]
    assert event["count"] == 1


def _requests() -> Counter[tuple[str, str, str]]:
    """Requests made so far, by (verb, resource, code), from the client's own metric."""
    counts: Counter[tuple[str, str, str]] = Counter()
    for metric in KUBE_REQUESTS.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total"):
                labels = sample.labels
                counts[(labels.get("verb", ""), labels.get("resource", ""),
                        labels.get("code", ""))] += int(sample.value)
    return counts


def test_status_is_patched_only_when_a_key_differs_and_a_gone_object_is_no_error(
        kube: Kube, local_kube) -> None:
    local_kube.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "fx"}})
    rate = local_kube.put({"apiVersion": "eventop.dev/v1", "kind": "ExchangeRate",
                           "metadata": {"name": "usd", "namespace": "fx"},
                           "spec": {"currency": "USD"}})
    assert kube.patch_status_if_changed(rate, {"rate": "1.08"})
    rate = kube.get("eventop.dev/v1", "ExchangeRate", "usd", "fx")
    version = rate["metadata"]["resourceVersion"]
    assert not kube.patch_status_if_changed(rate, {"rate": "1.08"})
    assert kube.get("eventop.dev/v1", "ExchangeRate", "usd", "fx")["metadata"][
        "resourceVersion"] == version
    local_kube.remove("eventop.dev/v1", "ExchangeRate", "usd", "fx")
    assert not kube.patch_status_if_changed(rate, {"rate": "1.09"})


def test_connections_to_the_api_server_use_tcp_keepalive(kube: Kube) -> None:
    """A watch whose peer vanished without a FIN is noticed by the kernel's keepalive probes."""
    import socket

    from eventop.kube.resources import Resource

    res = Resource("", "v1", "ConfigMap", "configmaps", True)
    resp = kube.request("GET", res.path("default"), verb="watch",
                        query=[("watch", "true"), ("timeoutSeconds", 1)], stream=True)
    try:
        sock = resp.connection.sock
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 30
    finally:
        resp.close()
        resp.release_conn()


@pytest.mark.parametrize(("path", "label"), [
    ("/api/v1/namespaces/team-a/configmaps/app", "configmaps"),
    ("/api/v1/namespaces/team-a/configmaps", "configmaps"),
    ("/api/v1/namespaces/team-a", "namespaces"),
    ("/api/v1/namespaces/team-a/status", "namespaces/status"),
    ("/api/v1/namespaces", "namespaces"),
    ("/apis/eventop.dev/v1/copyrules/main/status", "copyrules/status"),
    ("/apis/eventop.dev/v1/namespaces/f/exchangerates/usd/status", "exchangerates/status"),
    ("/apis/apps/v1/statefulsets", "statefulsets"),
    ("/apis/eventop.dev/v1", ""),
    ("/version", ""),
])
def test_request_metrics_name_the_resource_never_the_object(path: str, label: str) -> None:
    from eventop.kube.metrics import resource_label

    assert resource_label(path) == label


@pytest.mark.parametrize("name", ["/", "x/status", "..", ".", "", "a%2Fb", "x?watch=true"])
def test_a_name_no_object_can_have_is_not_found_never_another_path(kube: Kube,
                                                                   name: str) -> None:
    """Names come from event bodies: "x/status" must not address a subresource, "/" or ""
    the whole collection (which the fuzzer found: a List taken for a CopyRule)."""
    kube.apply({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "x", "namespace": "default"}})
    assert kube.get_or_none("v1", "ConfigMap", name, "default") is None
    assert kube.get_or_none("v1", "ConfigMap", "x", name or ".") is None
    assert kube.delete("v1", "ConfigMap", name or "..", "default") is False


def test_a_filtered_list_is_asked_for_in_one_page_and_an_unfiltered_one_in_pages(
        local_kube: LocalKube, kube: Kube) -> None:
    """Paginated filtered lists end early on 1.2x API servers (see Kube.pages and the cluster
    test beside this one)."""
    for i in range(5):
        local_kube.put({"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": f"cm-{i}", "namespace": "default",
                                     "labels": {"pick": "yes"}}})
    res = kube.resource("v1", "ConfigMap")
    local_kube.requests.clear()
    assert sum(len(p["items"]) for p in kube.pages(res, "default", label_selector="pick=yes",
                                                   limit=2)) == 5
    assert sum(len(p["items"]) for p in kube.pages(res, "default", limit=2)) >= 5
    queries = [q for m, p, q, _ in list(local_kube.requests) if p.endswith("/configmaps")]
    assert "limit" not in queries[0] and "labelSelector=pick" in queries[0]
    assert all("limit=2" in q for q in queries[1:]) and len(queries) >= 4


def test_an_apply_without_force_takes_back_its_own_created_fields_but_never_anothers(
        kube: Kube, local_kube) -> None:
    """The API server keeps a manager's create (operation Update) apart from its applies, so
    a plain apply of a child the engine created conflicted with the engine itself on every
    field it changed: every spec change of a handler's default child was refused (seen on a
    real v1.24 API server). A conflict with another manager is still refused."""
    mine = kube.for_manager("eventop-mine")
    cm = {"apiVersion": "v1", "kind": "ConfigMap",
          "metadata": {"name": "own-fields", "namespace": "default"}, "data": {"a": "1", "b": "1"}}
    mine.create(cm)
    applied = mine.apply({**cm, "data": {"a": "2", "b": "1"}}, force=False)
    assert applied["data"] == {"a": "2", "b": "1"}
    kube.for_manager("someone-else").apply(
        {**cm, "metadata": {**cm["metadata"]}, "data": {"b": "theirs"}}, force=True)
    with pytest.raises(Conflict) as refused:
        mine.apply({**cm, "data": {"a": "3", "b": "1"}}, force=False)
    assert not refused.value.only_with("eventop-mine")
    assert kube.get("v1", "ConfigMap", "own-fields", "default")["data"] == {"a": "2",
                                                                           "b": "theirs"}


@pytest.mark.parametrize(("message", "manager"), [
    ('conflict with "eventop-mine" using v1', "eventop-mine"),
    ('conflict with "eventop-mine" using apps/v1 at 2026-11-27T21:00:00Z', "eventop-mine"),
    ('conflict with "eventop-mine"', None),  # its own Apply entry: not a create of its own
    ('conflict with "eventop-mine" with subresource "status" using v1', None),
    ('conflict with "kubectl-edit" using v1', "kubectl-edit"),
])
def test_a_conflict_is_only_with_the_manager_whose_update_entry_every_cause_names(
        message: str, manager: str | None) -> None:
    exc = Conflict("Apply failed", body={"details": {"causes": [
        {"reason": "FieldManagerConflict", "message": message, "field": ".data.a"}]}})
    assert exc.only_with("eventop-mine") is (manager == "eventop-mine")


def test_every_request_is_counted_under_the_field_manager_of_the_handler_that_made_it(
        kube: Kube) -> None:
    from prometheus_client import REGISTRY

    def count(manager: str) -> float:
        return REGISTRY.get_sample_value("eventop_kube_requests_total", {
            "verb": "create", "resource": "configmaps", "code": "201",
            "manager": manager}) or 0.0

    before = count("eventop-tenants")
    kube.for_manager("eventop-tenants").create(
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": "counted", "namespace": "default"}})
    assert count("eventop-tenants") == before + 1


def test_a_normal_event_into_a_namespace_being_deleted_is_no_warning_a_warning_one_is_logged(
        kube: Kube, local_kube, caplog: pytest.LogCaptureFixture) -> None:
    """Nobody reads it, and the API server refuses it: a namespace of mirrors being deleted
    logged one warning per object. A Warning Event (a Database's NamespaceDeleted, saying
    where its data was kept) is logged instead: the README sends the user to the log."""
    local_kube.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "doomed"}})
    held = local_kube.put({"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": {"name": "held", "namespace": "doomed",
                                        "finalizers": ["example.com/hold"]}})
    local_kube.remove("v1", "Namespace", "doomed")
    with caplog.at_level(logging.DEBUG, logger="eventop.kube"):
        kube.post_event(held, "Normal", "Testing", "too late")
        kube.post_event(held, "Warning", "NamespaceDeleted", "the data stays on pv-1")
    [record] = [r for r in caplog.records if "could not record Event" in r.getMessage()]
    assert record.levelno == logging.DEBUG and "being terminated" in record.getMessage()
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.getMessage() == (
        "NamespaceDeleted doomed/held: the data stays on pv-1 (its namespace is being deleted, "
        "so this Warning Event can not be recorded there)")


def test_a_403_soon_after_the_api_server_failed_says_it_has_most_likely_just_restarted(
) -> None:
    """A kube-apiserver refuses everyone for a few seconds after it starts, until its RBAC
    data is loaded: a 403 right after the client saw it fail is not the missing grant it
    reads like (a trial's operator looked for one after a restart)."""
    import http.server
    import threading

    answers = [403, 503, 403]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status = answers.pop(0)
            body = json.dumps({"kind": "Status", "status": "Failure", "code": status,
                               "reason": "Forbidden" if status == 403 else "ServiceUnavailable",
                               "message": f"answer {status}"}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        kube = Kube.connect(url=f"http://127.0.0.1:{server.server_port}")
        with pytest.raises(Forbidden) as first:
            kube.get("v1", "ConfigMap", "a", "default")
        assert str(first.value) == "403 Forbidden: answer 403"  # never failed: a grant missing
        with pytest.raises(Unavailable):
            kube.get("v1", "ConfigMap", "a", "default")
        with pytest.raises(Forbidden) as after:
            kube.get("v1", "ConfigMap", "a", "default")
        assert "the API server failed or was unreachable 0s ago: one that has just started " \
               "refuses everyone" in str(after.value)
    finally:
        server.shutdown()
