"""What a rig kubelet is started with: its KubeletConfiguration, the ``/proc/sys`` files it may rewrite, and the
shell that mounts a fakecri node's private ``/var/lib``, ``/var/log`` and sysctl files before it execs the kubelet."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from accel_rig.clusterdns import CLUSTER_DOMAIN, DNS_IP
from accel_rig.nodelayout import CONTAINERD, NodeLayout

#: ``/proc/sys`` entries the kubelet's container manager rewrites at start (``setupKernelTunables``).
KUBELET_SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
#: Kubelet feature gates: device health from DRA drivers into the Pod status (``allocatedResourcesStatus``).
KUBELET_FEATURE_GATES: Mapping[str, bool] = {"ResourceHealthStatus": True}


def write_sysctl_files(proc_sys: Path) -> None:
    """One file per :data:`KUBELET_SYSCTLS` entry in ``proc_sys``, holding the machine's current value."""
    for entry in KUBELET_SYSCTLS:
        target = proc_sys / entry.replace("/", ".")
        try:
            value = (Path("/proc/sys") / entry).read_text()
        except OSError:
            value = "0\n"
        target.write_text(value)


def kubelet_configuration(layout: NodeLayout, ports: tuple[int, ...], ca_cert: Path,
                          feature_gates: Mapping[str, bool]) -> dict[str, Any]:
    """The KubeletConfiguration of a node: API and healthz on ``ports``, clients trusted by ``ca_cert``."""
    port, healthz = ports
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # A containerd node's kubelet serves its namespace's addresses (the API server's egress proxy dials the
        # node's address there; pods reach it at their gateway); a fakecri node's serves the machine's loopback.
        "address": "0.0.0.0" if layout.runtime == CONTAINERD else "127.0.0.1",
        "port": port,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz,
        "readOnlyPort": 0,
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                           "x509": {"clientCAFile": str(ca_cert)}},
        "authorization": {"mode": "AlwaysAllow"},
        "containerRuntimeEndpoint": ("unix:///run/containerd/containerd.sock" if layout.runtime == CONTAINERD
                                     else f"unix://{layout.cri_socket}"),
        # This machine is cgroup v1 and runs no real containers: no QoS or allocatable cgroups.
        "failCgroupV1": False,
        "cgroupsPerQOS": False,
        "enforceNodeAllocatable": [],
        "cgroupDriver": "cgroupfs",
        "failSwapOn": False,
        "localStorageCapacityIsolation": False,
        # Nothing real is stored: never evict for a full disk of the machine, never garbage-collect images.
        "evictionHard": {"memory.available": "1Mi", "nodefs.available": "0%", "imagefs.available": "0%",
                         "nodefs.inodesFree": "0%", "imagefs.inodesFree": "0%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        # Re-sync pods every 10 s (default 1 min), so a pod that found a plugin not yet registered retries soon.
        "syncFrequency": "10s",
        # Report a changed status (allocatable after a device plugin registers) within 2 s, not 10 s.
        "nodeStatusUpdateFrequency": "2s",
        "resolvConf": "",
        # Pods' resolv.conf: the node's cluster DNS (nodeservices; containerd nodes only, fakecri pods have no
        # network) and the search domains of the cluster domain.
        **({"clusterDNS": [DNS_IP], "clusterDomain": CLUSTER_DOMAIN} if layout.runtime == CONTAINERD else {}),
        "featureGates": dict(sorted(feature_gates.items())),
    }


def namespace_script(layout: NodeLayout, kubelet_argv: Sequence[str]) -> str:
    """Shell run by ``unshare --mount``: the private mounts, then exec the kubelet."""
    q = shlex.quote
    lines = ["set -e",
             f"mount --bind {q(str(layout.var_lib))} /var/lib",
             f"mount --bind {q(str(layout.var_log))} /var/log"]
    for entry in KUBELET_SYSCTLS:
        lines.append(f"mount --bind {q(str(layout.proc_sys / entry.replace('/', '.')))} /proc/sys/{entry}")
    lines.append("exec " + " ".join(q(a) for a in kubelet_argv))
    return "\n".join(lines)
