"""Reading the kubelet's PodResources v1 ``List`` answer: which device IDs of which resources pods hold."""

from __future__ import annotations

from collections.abc import Iterable

from accel_core.kubeletapi import podresources_v1_pb2 as pr


def devices_in_use(response: pr.ListPodResourcesResponse, resources: Iterable[str]) -> dict[str, set[str]]:
    """Resource -> IDs held by any container (regular and init containers alike), for the given resources."""
    out: dict[str, set[str]] = {r: set() for r in resources}
    for pod in response.pod_resources:
        for container in pod.containers:
            for dev in container.devices:
                if dev.resource_name in out:
                    out[dev.resource_name].update(dev.device_ids)
    return out


def devices_by_pod(response: pr.ListPodResourcesResponse, resources: Iterable[str]) -> dict[str, dict[str, set[str]]]:
    """``namespace/name`` -> resource -> IDs its containers hold, for pods holding any of the given resources."""
    wanted = set(resources)
    out: dict[str, dict[str, set[str]]] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            for dev in container.devices:
                if dev.resource_name in wanted:
                    held = out.setdefault(f"{pod.namespace}/{pod.name}", {})
                    held.setdefault(dev.resource_name, set()).update(dev.device_ids)
    return out
