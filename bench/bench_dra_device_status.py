"""What writing the claims' device status (status.devices, ``--device-status on``, the default) costs a prepare.

Two ``neuron-dra-driver serve`` processes (fake trn2.48xlarge hosts), one with ``--device-status on`` and one
with ``off``, each under its own kubelet stand-in, against one real kube-apiserver; prepares of one claim (one
device, created allocated) interleaved driver by driver, each followed by an unprepare, as in compare_dra.py.
The status is written by a task on the driver's event loop 0.2 s after the kubelet has its answer (and not at all
for a claim unprepared meanwhile, as every claim of the loop is), so the prepare should cost the same; at the end
one more claim is left prepared, and the script counts the claims whose status.devices each driver wrote.

    .venv/bin/python bench/bench_dra_device_status.py [--iterations 200]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from accel_rig.controlplane import ControlPlane  # noqa: E402
from compare_common import console_script, p50, pct  # noqa: E402
from compare_dra import Driver, allocated_claim, prepare, start, stop  # noqa: E402
from lightkube import Client, KubeConfig  # noqa: E402
from lightkube.resources.resource_v1 import ResourceClaim  # noqa: E402

from accel_core.fakehost import build_host  # noqa: E402


async def run(root: Path, iterations: int, control: bool) -> None:
    with ControlPlane(root / "cp", with_controller_manager=False, with_scheduler=False) as cp:
        admin = Client(KubeConfig.from_file(cp.admin_kubeconfig))
        drivers = {mode: Driver(f"status-{mode}", "neuron.aws.com", f"status-{mode}", "neuron-device-{i}")
                   for mode in ("on", "off")}
        try:
            for mode, d in drivers.items():
                host = build_host(root / f"host-{mode}", "trn2.48xlarge")
                kubelet = root / d.name / "kubelet"
                d.argv = [console_script("neuron-dra-driver"), "serve", "--host-root", str(host.root),
                          "--node-name", d.node, "--kubelet-root", str(kubelet),
                          "--device-plugins-dir", str(kubelet / "device-plugins"),
                          "--cdi-root", str(root / d.name / "cdi"), "--kubeconfig", str(cp.admin_kubeconfig),
                          "--metrics-port", "0", "--healthcheck-port", "-1", "--log-level", "WARNING",
                          "--device-status", "off" if control else mode]
                cp.create_fake_node(d.node)
                d.claims = [allocated_claim(admin, d, i) for i in range(2)]
                (root / d.name).mkdir(parents=True, exist_ok=True)
                await start(d, admin, root / d.name, 16)
            for d in drivers.values():  # warm-up
                await prepare(d, d.claims[:1], [])
            for _ in range(iterations):
                for d in drivers.values():
                    await prepare(d, d.claims[:1], d.one)
            for d in drivers.values():  # one claim left prepared: its status is written after the delay
                assert d.conn is not None
                await d.conn.prepare(*d.claims[1:2])
            await asyncio.sleep(1.0)
            written = {mode: sum(bool((admin.get(ResourceClaim, name, namespace=ns).to_dict().get("status") or {})
                                      .get("devices")) for ns, _, name in d.claims)
                       for mode, d in drivers.items()}
        finally:
            for d in drivers.values():
                with contextlib.suppress(Exception):
                    await stop(d)
            admin.close()
    print(f"prepare of 1 claim through the DRA socket, {iterations} interleaved rounds (load {os.getloadavg()[0]:.1f})"
          + (" - CONTROL: both drivers have device status off" if control else ""))
    for mode, d in drivers.items():
        print(f"  device status {mode:3}: p50 {p50(d.one) * 1e3:6.3f} ms  p90 {pct(d.one, 0.9) * 1e3:6.3f} ms  "
              f"claims with status.devices: {written[mode]}")
    print(f"  on/off p50: {p50(drivers['on'].one) / p50(drivers['off'].one):.2f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--control", action="store_true",
                        help="both drivers with --device-status off: the difference the two slots make alone")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-status-") as tmp:
        asyncio.run(run(Path(tmp), args.iterations, args.control))
    return 0


if __name__ == "__main__":
    sys.exit(main())
