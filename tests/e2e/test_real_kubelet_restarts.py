"""Restarts with pods running, through the REAL kubelet: devices stay with the pods that hold them.

A kubelet restart deletes every socket in the device-plugins directory (the plugins must register again) and the
kubelet restores its assignments from its own checkpoint; a daemon restart must learn again what is in use (the
Neuron plugin reads it from the kubelet's PodResources API). In both cases a later pod gets only free devices.
(The DRA side, kubelet restart and driver kill -9, is in test_real_kubelet_dra.py.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psutil
from conftest import Daemon, RealNode
from kube_helpers import EFA, NEURON, NEURONCORE, allocatable, create_pod, pod_phase
from lightkube import Client

Wait = Callable[..., Any]
MakeNode = Callable[..., RealNode]
StartDaemon = Callable[..., Daemon]


def _neurons(paths: list[str]) -> set[int]:
    return {int(p.removeprefix("/dev/neuron")) for p in paths}


def _registrations(node: RealNode, resource: str) -> int:
    """How often the running kubelet accepted a Register of ``resource``, so a test can wait for the kubelet to know
    a new plugin process, not just read an allocatable figure the old process left behind."""
    return node.kubelet.device_plugin_registrations(resource)


def test_neuron_devices_stay_with_their_pod_across_kubelet_and_plugin_restarts(
        kubelet_node: MakeNode, daemon: StartDaemon, kube_client: Client, namespace: str, wait: Wait) -> None:
    node = kubelet_node("trn2.48xlarge")
    plugin = daemon("neuron-device-plugin", "serve", "--metrics-port", "0", env=node.env())
    wait(lambda: allocatable(kube_client, node.name, NEURON) == 16, "neuron 16", timeout=60)
    create_pod(kube_client, namespace, "first", node.name, limits={NEURON: "4"})
    wait(lambda: pod_phase(kube_client, namespace, "first") == "Running", "first pod Running", timeout=90)
    (first,) = node.kubelet.containers("first", namespace)
    held = _neurons(first.device_paths)

    node.kubelet.restart_kubelet()
    node.kubelet.wait_ready(timeout=120)
    wait(lambda: allocatable(kube_client, node.name, NEURON) == 16, "the plugin registered again", timeout=60)
    seen = {r: _registrations(node, r) for r in (NEURON, NEURONCORE)}
    plugin.stop()
    again = daemon("neuron-device-plugin", "serve", "--metrics-port", "0", env=node.env())
    wait(lambda: all(_registrations(node, r) > n for r, n in seen.items()), "the new plugin process registered",
         timeout=60)
    # The new plugin process learns from PodResources that the first pod's 4 devices (16 cores) are taken; its own
    # log says so. The Node's allocatable read 48 already before the restarts, and until the new process has sent its
    # lists the kubelet has no healthy device to admit a pod with (UnexpectedAdmissionError: a plugin restart's gap).
    wait(lambda: "resource=aws.amazon.com/neuroncore devices=64 healthy=48" in again.tail(100),
         "the new process withdrawing the held cores", timeout=60)
    wait(lambda: allocatable(kube_client, node.name, NEURONCORE) == 64 - 16, "the held cores withdrawn again",
         timeout=60)

    assert pod_phase(kube_client, namespace, "first") == "Running"
    assert len(node.kubelet.containers("first", namespace)) == 1, "a restart re-created the first pod's container"
    create_pod(kube_client, namespace, "rest", node.name, limits={NEURON: "12"})
    wait(lambda: pod_phase(kube_client, namespace, "rest") == "Running", "the 12-device pod Running", timeout=90)
    (rest,) = node.kubelet.containers("rest", namespace)
    assert _neurons(rest.device_paths) == set(range(16)) - held


def test_efa_devices_stay_with_their_pod_across_kubelet_and_plugin_restarts(
        kubelet_node: MakeNode, daemon: StartDaemon, kube_client: Client, namespace: str, wait: Wait) -> None:
    node = kubelet_node("p5.48xlarge")
    plugin = daemon("efa-device-plugin", "serve", "--metrics-port", "0", env=node.env())
    wait(lambda: allocatable(kube_client, node.name, EFA) == 32, "efa 32", timeout=60)
    create_pod(kube_client, namespace, "first", node.name, limits={EFA: "8"})
    wait(lambda: pod_phase(kube_client, namespace, "first") == "Running", "first pod Running", timeout=90)
    (first,) = node.kubelet.containers("first", namespace)

    plugin.stop()
    second = daemon("efa-device-plugin", "serve", "--metrics-port", "0", env=node.env())
    node.kubelet.restart_kubelet()
    node.kubelet.wait_ready(timeout=120)
    wait(lambda: _registrations(node, EFA) > 0, "the plugin registered with the new kubelet", timeout=60)
    wait(lambda: allocatable(kube_client, node.name, EFA) == 32, "the plugin registered again", timeout=60)

    # gRPC's runtime stays up while the plugin serves again (accel_core/grpc_runtime.py): the same threads serve
    # after more kubelet restarts (a runtime that shut down with the plugin's server brought ~7 new ones each time)
    assert second.proc is not None
    threads = {t.id for t in psutil.Process(second.proc.pid).threads()}
    for _ in range(2):
        node.kubelet.restart_kubelet()
        node.kubelet.wait_ready(timeout=120)
        wait(lambda: _registrations(node, EFA) > 0, "the plugin registered with the new kubelet", timeout=60)
    new_threads = {t.id for t in psutil.Process(second.proc.pid).threads()} - threads
    assert len(new_threads) <= 3, f"{len(new_threads)} new threads over 2 kubelet restarts"
    wait(lambda: allocatable(kube_client, node.name, EFA) == 32, "the plugin registered again", timeout=60)

    assert pod_phase(kube_client, namespace, "first") == "Running"
    create_pod(kube_client, namespace, "rest", node.name, limits={EFA: "24"})
    wait(lambda: pod_phase(kube_client, namespace, "rest") == "Running", "the 24-EFA pod Running", timeout=90)
    (rest,) = node.kubelet.containers("rest", namespace)
    assert not set(first.device_paths) & set(rest.device_paths)
    assert len(set(first.device_paths) | set(rest.device_paths)) == 32
