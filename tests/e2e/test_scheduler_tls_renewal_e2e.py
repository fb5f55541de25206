"""The chart renews its own extender certificates on ``helm upgrade`` when they are expired or nearly expired, on
the real control plane (``lookup`` reads the Secrets there): a fresh pair is kept, one with less than a third of its
lifetime left, an expired one and one whose Secret does not say when it expires (made by an older chart) are
replaced by a new CA and pair, both Secrets with the same CA, and both Deployments restart with them."""

from __future__ import annotations

import base64
import time
from pathlib import Path
from typing import Any

import pytest
from accel_rig.controlplane import ControlPlane
from chart_render import NEURON_CHART
from cryptography import x509
from lightkube import Client
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import Secret
from runtime_helpers import Helm

DAY = 86400
SECRETS = ("neuron-scheduler-extender-tls", "my-scheduler-extender-client-tls")
NOT_BEFORE, NOT_AFTER = "neuron.amazonaws.com/tls-not-before", "neuron.amazonaws.com/tls-not-after"
FLAGS = ("--namespace", "default", "--set", "npd.enabled=false", "--set", "devicePlugin.enabled=false",
         "--set", "scheduler.enabled=true")  # fmt: skip


@pytest.fixture
def helm(control_plane: ControlPlane, tmp_path: Path) -> Helm:
    return Helm(control_plane, tmp_path)


def _secrets(kube: Client) -> dict[str, dict[str, Any]]:
    out = {}
    for name in SECRETS:
        obj = kube.get(Secret, name, namespace="kube-system").to_dict()
        out[name] = {"data": obj.get("data") or {}, "notes": obj["metadata"].get("annotations") or {}}
    return out


def _checksums(kube: Client) -> dict[str, str]:
    out = {}
    for name in ("my-scheduler", "neuron-scheduler-extender"):
        meta = kube.get(Deployment, name, namespace="kube-system").to_dict()["spec"]["template"]["metadata"]
        out[name] = (meta.get("annotations") or {}).get("checksum/tls", "")
    return out


def _not_after(secrets: dict[str, dict[str, Any]]) -> float:
    pem = base64.b64decode(secrets[SECRETS[0]]["data"]["tls.crt"])
    return x509.load_pem_x509_certificate(pem).not_valid_after_utc.timestamp()


def test_upgrade_renews_expired_or_nearly_expired_chart_certificates(kube_client: Client, helm: Helm) -> None:
    now = int(time.time())
    cases = {  # the server Secret's annotations before an upgrade -> renewed?
        "fresh": (None, False),
        "a sixth of the lifetime left": ({NOT_BEFORE: str(now - 100 * DAY), NOT_AFTER: str(now + 20 * DAY)}, True),
        "expired": ({NOT_BEFORE: str(now - 10 * DAY), NOT_AFTER: str(now - 60)}, True),
        "made by an older chart": ({NOT_BEFORE: None, NOT_AFTER: None}, True),
    }
    helm("install", "neuron-renew", str(NEURON_CHART), *FLAGS)
    try:
        for case, (notes, renewed) in cases.items():
            if notes is not None:
                kube_client.patch(Secret, SECRETS[0], {"metadata": {"annotations": notes}}, namespace="kube-system")
            before, sums = _secrets(kube_client), _checksums(kube_client)
            helm("upgrade", "neuron-renew", str(NEURON_CHART), *FLAGS)
            after = _secrets(kube_client)
            if not renewed:
                assert [a["data"] for a in after.values()] == [b["data"] for b in before.values()], case
                assert _checksums(kube_client) == sums, case
                continue
            for name in SECRETS:
                assert after[name]["data"]["tls.crt"] != before[name]["data"]["tls.crt"], f"{case}: {name}"
                assert after[name]["data"]["ca.crt"] != before[name]["data"]["ca.crt"], f"{case}: {name}"
            assert after[SECRETS[0]]["data"]["ca.crt"] == after[SECRETS[1]]["data"]["ca.crt"], case
            assert _not_after(after) > time.time() + 3000 * DAY, f"{case}: a new pair for validityDays (3650)"
            assert abs(int(after[SECRETS[0]]["notes"][NOT_AFTER]) - _not_after(after)) < 120, case
            new_sums = _checksums(kube_client)
            assert all(new_sums[d] != sums[d] for d in sums), f"{case}: both Deployments restart"
    finally:
        helm("uninstall", "neuron-renew", "--namespace", "default")
