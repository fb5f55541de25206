"""What the admission webhook costs: ``neuron-dra-driver webhook`` runs as a process with a throw-away certificate
for 127.0.0.1; one kept-alive TLS connection posts the AdmissionReview of a ResourceClaimTemplate with
``logicalNeuronCore: 3`` (refused) ``--reviews`` times. Prints the process's RSS after start and after the reviews
(for the chart's ``resources``) and the round trip's p50, p99 and max (what the API server adds to a claim create).

    PYTHONPATH=. .venv/bin/python bench/bench_admission_webhook.py [--reviews 2000]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from accel_rig.certs import issue, make_ca

REVIEW = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
    "uid": "b0e7c4f2-0d3a-4c51-9a55-1f6c8d2e7a90",
    "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaimTemplate"}, "operation": "CREATE",
    "object": {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
               "metadata": {"name": "lnc3", "namespace": "default"},
               "spec": {"spec": {"devices": {
                   "requests": [{"name": "neuron", "exactly": {"deviceClassName": "neuron.aws.com"}}],
                   "config": [{"requests": ["neuron"], "opaque": {"driver": "neuron.aws.com", "parameters": {
                       "apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCore": 3}}}]}}}}}}


def rss_mib(pid: int) -> int:
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("VmRSS"))
    return int(line.split()[1]) // 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reviews", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        make_ca(d / "ca.crt", d / "ca.key", "/CN=bench-ca", days=1)
        issue(d / "ca.crt", d / "ca.key", d / "tls.crt", d / "tls.key", "/CN=127.0.0.1", days=1,
              server_sans=["IP:127.0.0.1"])
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        proc = subprocess.Popen([sys.executable, "-m", "neuron_dra.dra.cli", "webhook", "--address", "127.0.0.1",
                                 "--port", str(port), "--tls-cert-file", str(d / "tls.crt"), "--tls-key-file",
                                 str(d / "tls.key"), "--log-level", "WARNING"],
                                env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
        try:
            ctx = ssl.create_default_context(cafile=str(d / "ca.crt"))
            conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
            deadline = time.monotonic() + 30
            while True:
                try:
                    conn.request("GET", "/healthz")
                    conn.getresponse().read()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    conn.close()
                    time.sleep(0.1)
            started = rss_mib(proc.pid)
            body = json.dumps(REVIEW).encode()
            took = []
            for _ in range(args.reviews):
                t0 = time.perf_counter()
                conn.request("POST", "/validate", body=body, headers={"Content-Type": "application/json"})
                answer = json.loads(conn.getresponse().read())
                took.append((time.perf_counter() - t0) * 1000)
                assert answer["response"]["allowed"] is False, answer
            took.sort()
            print(f"RSS {started} MiB after start, {rss_mib(proc.pid)} MiB after {args.reviews} reviews; "
                  f"round trip p50 {took[len(took) // 2]:.2f} ms, p99 {took[int(len(took) * 0.99)]:.2f} ms, "
                  f"max {took[-1]:.2f} ms")
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
