"""``<driver> handoff``: the charts' pre-delete hook, so ``helm uninstall`` hands the nodes to the device plugin
at once.

``helm uninstall`` deletes a release's DaemonSet, service account and RBAC in one sweep, and the driver pods are
stopped only afterwards, without the right to delete their ResourceSlices; the kubelet wipes those 30 s later, and
the device plugin must wait that long (coexistence: never both sides). Run first as a pre-delete hook, this command
deletes the DaemonSet in the foreground (its pods first) and waits until it is gone: each driver then stops with
its RBAC intact, sees its DaemonSet being deleted, removes its slices and its presence file, and the device plugin
serves the node within seconds.

It never fails the uninstall: every error is one log line and exit 0 (the drivers then fall back to the 30 s path).
"""

from __future__ import annotations

import logging
import time

from accel_core.logs import kv

log = logging.getLogger(__name__)


def handoff(namespace: str, daemonset: str, *, timeout: float = 120.0, kubeconfig: str | None = None) -> int:
    """Delete ``namespace/daemonset`` in the foreground and wait until it is gone (at most ``timeout`` s); 0."""
    from lightkube import ApiError, Client
    from lightkube.core.exceptions import ConfigError
    from lightkube.resources.apps_v1 import DaemonSet
    from lightkube.types import CascadeType

    from accel_core.kubeconfig import load_kubeconfig

    try:
        client = Client(load_kubeconfig(kubeconfig), field_manager="accel-dra-handoff")
    except (ConfigError, OSError, ValueError) as exc:
        log.error("no API server configuration; the drivers fall back to the kubelet's slice wipe", extra=kv(
            error=exc))
        return 0
    where = f"{namespace}/{daemonset}"
    start = time.monotonic()
    try:
        client.delete(DaemonSet, daemonset, namespace=namespace, cascade=CascadeType.FOREGROUND)
        log.info("deleting the DaemonSet, its pods first", extra=kv(daemonset=where))
        while time.monotonic() - start < timeout:
            try:
                client.get(DaemonSet, daemonset, namespace=namespace)
            except ApiError as exc:
                if exc.status.code == 404:
                    log.info("DaemonSet gone: every driver left its node", extra=kv(
                        daemonset=where, seconds=round(time.monotonic() - start, 1)))
                    return 0
                raise
            time.sleep(0.5)
        log.warning("DaemonSet still there; helm goes on", extra=kv(daemonset=where, waited_seconds=timeout))
    except ApiError as exc:
        if exc.status.code == 404:
            log.info("no DaemonSet to delete", extra=kv(daemonset=where))
        else:
            log.error("cannot delete the DaemonSet; the drivers fall back to the kubelet's slice wipe",
                      extra=kv(daemonset=where, error=exc))
    except Exception as exc:  # noqa: BLE001 - never fail the uninstall
        log.error("handoff failed; the drivers fall back to the kubelet's slice wipe", extra=kv(daemonset=where,
                                                                                                error=exc))
    finally:
        client.close()
    return 0
