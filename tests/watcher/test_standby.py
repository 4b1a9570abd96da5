"""Two watchers with leader election: one emits, the other stands by until it exits."""

from __future__ import annotations

from eventop.testing.processes import WatcherProcess
from eventop.testing.waiting import wait_until


def holder(local_kube) -> str:
    lease = local_kube.get("coordination.k8s.io/v1", "Lease", "eventop-watcher", "default")
    return lease["spec"]["holderIdentity"] if lease else ""


def test_second_replica_stands_by_until_the_first_exits(local_kube, sink, tmp_path) -> None:
    env = {"EVENTOP_RESOURCES": "v1/configmaps@demo", "EVENTOP_KUBE_URL": local_kube.url,
           "EVENTOP_METRICS_PORT": "0", "EVENTOP_LEASE_NAMESPACE": "default",
           "EVENTOP_LEASE_SECONDS": "2", "EVENTOP_RENEW_DEADLINE_SECONDS": "1.5",
           "EVENTOP_RETRY_PERIOD_SECONDS": "0.2", "EVENTOP_READ_TIMEOUT_SECONDS": "2",
           "EVENTOP_WATCH_TIMEOUT_SECONDS": "1"}
    local_kube.put({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "one", "namespace": "demo"}})
    elect = ["--leader-elect"]
    first = WatcherProcess(sink.url, {**env, "HOSTNAME": "first"}, str(tmp_path), elect)
    second = None
    try:
        assert sink.wait_for(2, 30)  # the ConfigMap and kube-root-ca.crt
        second = WatcherProcess(sink.url, {**env, "HOSTNAME": "second"}, str(tmp_path), elect)
        assert wait_until(lambda: "standing by" in second.log(), 30), second.log()
        assert len(sink.accepted) == 2  # the standby lists nothing
        assert holder(local_kube).startswith("first_")
        first.stop(keep_log=True)  # SIGTERM: release the lease on the way out
        assert first.returncode == 0, first.log()
        assert sink.wait_for(4, 30)  # the new leader's initial list
        assert holder(local_kube).startswith("second_")
    finally:
        for proc in (first, second):
            if proc is not None:
                proc.stop()
