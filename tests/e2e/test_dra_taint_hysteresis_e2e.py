"""The unhealthy taint's timing on the real kube-apiserver: the EFA DRA driver (console script, admin kubeconfig) on
a fake p4d.24xlarge host (4 EFAs, efa.md) and a fake Node.

- With ``--unhealthy-taint-effect NoExecute``, a port DOWN is NoSchedule at once and NoExecute only after
  ``--noexecute-after``; ``timeAdded`` is when the port was first seen DOWN (NoSchedule) and that plus the hold
  (NoExecute).
- A driver restart keeps ``timeAdded`` while the taint persists, even when the restarted driver rewrites the pool
  (another port going DOWN). Facts: the API server stamps the time of the write on a taint sent without
  ``timeAdded`` (so without the fix the rewrite moves it), and stores whole seconds.
- A port that came back and goes DOWN again is a new taint with a new time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from accel_rig.controlplane import ControlPlane
from conftest import Daemon
from lightkube import Client
from lightkube.resources.resource_v1 import ResourceSlice

from accel_core.fakehost import FakeHost, build_host

Wait = Callable[..., Any]
DRIVER = "efa.aws.com"
KEY = f"{DRIVER}/unhealthy"
HOLD = 4


def taints(client: Client, node: str) -> dict[str, tuple[str, datetime]]:
    """rdma device -> (effect, timeAdded) of its unhealthy taint, as the API server holds it."""
    out = {}
    for sl in client.list(ResourceSlice, fields={"spec.nodeName": node, "spec.driver": DRIVER}):
        for dev in sl.to_dict()["spec"].get("devices") or []:
            for t in dev.get("taints") or []:
                if t["key"] == KEY:
                    out[dev["attributes"]["rdmaDevice"]["string"]] = (
                        t["effect"], datetime.fromisoformat(t["timeAdded"].replace("Z", "+00:00")))
    return out


def published(client: Client, node: str) -> int:
    return sum(len(s.spec.devices or []) for s in client.list(ResourceSlice, fields={"spec.nodeName": node,
                                                                                      "spec.driver": DRIVER}))


def test_noexecute_after_the_hold_and_time_added_kept_across_a_restart(
        control_plane: ControlPlane, kube_client: Client, fake_node: Callable[..., str],
        daemon: Callable[..., Daemon], short_tmp: Path, wait: Wait) -> None:
    node = fake_node()
    host: FakeHost = build_host(short_tmp / "host", "p4d.24xlarge")
    ibdevs = sorted(p.name for p in (host.root / "sys/class/infiniband").iterdir())
    assert len(ibdevs) == 4, ibdevs
    first, second = ibdevs[:2]

    def start() -> Daemon:
        return daemon("efa-dra-driver", "serve", "--host-root", str(host.root),
                      "--kubelet-root", str(short_tmp / "kubelet"), "--cdi-root", str(short_tmp / "cdi"),
                      "--device-plugins-dir", str(short_tmp / "kubelet" / "device-plugins"),
                      "--metrics-port", "0", "--healthcheck-port", "-1", "--rescan-interval", "1",
                      "--unhealthy-taint-effect", "NoExecute", "--noexecute-after", str(HOLD),
                      "--min-slice-write-interval", "1",
                      env={"NODE_NAME": node, "POD_UID": "pod-1", "KUBECONFIG": str(control_plane.admin_kubeconfig)})

    driver = start()
    wait(lambda: published(kube_client, node) == 4, "4 EFAs published", timeout=60)
    down_at = time.time()
    host.set_port_state(first, "DOWN")
    effect, no_schedule_at = wait(lambda: taints(kube_client, node).get(first), "the NoSchedule taint", timeout=30)
    assert effect == "NoSchedule", "at once, not NoExecute"
    assert time.time() - down_at < HOLD, "NoSchedule went out before the hold ended"
    effect, no_execute_at = wait(lambda: (t := taints(kube_client, node).get(first)) and t[0] == "NoExecute" and t,
                                 "the NoExecute taint after the hold", timeout=30)
    assert (no_execute_at - no_schedule_at).total_seconds() == HOLD, (no_schedule_at, no_execute_at)

    assert driver.stop() == 0
    time.sleep(2.5)  # a time stamped by the API server at the restart would differ by seconds
    driver = start()
    wait(lambda: "devices found" in driver.tail(200), "the restarted driver's first scan")
    host.set_port_state(second, "DOWN")  # the restarted driver rewrites the pool
    second_taint = wait(lambda: taints(kube_client, node).get(second), "the second port's taint", timeout=30)
    assert second_taint[0] == "NoSchedule"
    assert taints(kube_client, node)[first] == ("NoExecute", no_execute_at), "timeAdded kept across the restart"
    assert second_taint[1] > no_execute_at

    host.set_port_state(first, "ACTIVE")
    wait(lambda: first not in taints(kube_client, node), "the taint gone once the port is back", timeout=30)
    time.sleep(1.1)
    host.set_port_state(first, "DOWN")
    effect, again = wait(lambda: taints(kube_client, node).get(first), "a new taint", timeout=30)
    assert effect == "NoSchedule" and again > no_execute_at, "a new taint, a new time"
    assert driver.running(), driver.tail()
