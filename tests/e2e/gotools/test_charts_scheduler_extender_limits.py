"""The Neuron chart's scheduler.extender limits: one replica only (each replica would keep its own reservation
book behind one Service), the per-namespace reservation share reaching the extender, and chart-made certificates
whose Secrets say when they were made and expire (what an upgrade reads to renew them; Helm templates cannot read a
certificate's dates)."""

from __future__ import annotations

import base64
import time
from pathlib import Path

import pytest
from chart_render import NEURON_CHART, RenderError, container, env_of, template
from cryptography import x509

EXTENDER = "neuron-scheduler-extender"
NOT_BEFORE, NOT_AFTER = "neuron.amazonaws.com/tls-not-before", "neuron.amazonaws.com/tls-not-after"


pytestmark = pytest.mark.gotools  # helm, built from Go (the shared fixture in tests/e2e/conftest.py)


def test_more_than_one_extender_replica_is_refused(helm: Path) -> None:
    with pytest.raises(RenderError, match="replicas"):
        template(helm, NEURON_CHART, "--set", "scheduler.enabled=true", "--set", "scheduler.extender.replicas=2")
    # without the schema (helm --skip-schema-validation) the template says why
    with pytest.raises(RenderError, match="replicas must be 1: each replica would keep its own reservation book"):
        template(helm, NEURON_CHART, "--set", "scheduler.enabled=true", "--set", "scheduler.extender.replicas=3",
                 "--skip-schema-validation")
    r = template(helm, NEURON_CHART, "--set", "scheduler.enabled=true")
    assert r.get("Deployment", EXTENDER)["spec"]["replicas"] == 1


def test_the_namespace_share_reaches_the_extender(helm: Path) -> None:
    r = template(helm, NEURON_CHART, "--set", "scheduler.enabled=true",
                 "--set", "scheduler.extender.maxReservationsPerNamespace=32")
    assert env_of(container(r.get("Deployment", EXTENDER)))["MAX_RESERVATIONS_PER_NAMESPACE"] == "32"
    with pytest.raises(RenderError, match="maxReservationsPerNamespace"):
        template(helm, NEURON_CHART, "--set", "scheduler.enabled=true",
                 "--set", "scheduler.extender.maxReservationsPerNamespace=0")


def test_chart_made_secrets_say_when_their_certificates_expire(helm: Path) -> None:
    before = time.time()
    r = template(helm, NEURON_CHART, "--set", "scheduler.enabled=true", "--set", "scheduler.tls.validityDays=90")
    for name in (f"{EXTENDER}-tls", "my-scheduler-extender-client-tls"):
        secret = r.get("Secret", name)
        notes = secret["metadata"]["annotations"]
        made, expires = int(notes[NOT_BEFORE]), int(notes[NOT_AFTER])
        assert before - 5 <= made <= time.time() + 5
        assert expires - made == 90 * 86400
        cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
        assert abs(cert.not_valid_after_utc.timestamp() - expires) < 120, "the annotation matches the certificate"
