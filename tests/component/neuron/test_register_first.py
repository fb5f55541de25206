"""Start-up registers first: the daemons' CLI modules load only what serving and registering need, and the
scan, the catalog, metrics and the watchers load after the kubelet has the registration (the kubelet then waits
for the first ListAndWatch answer). The component tests of both plugins run this same path
(DevicePluginService.run); these check what only it does."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from pathlib import Path

from accel_rig.kubelet_standin import KubeletStandIn
from accel_rig.polling import until
from hostcache import copy_host

from neuron_dra.deviceplugin.options import ServeOptions
from neuron_dra.deviceplugin.start import service

HEAVY = ("prometheus_client", "yaml", "lightkube", "asyncinotify", "pyudev", "accel_core.awsfacts.catalog",
         "neuron_dra.discovery", "efa_plugin.discovery", "accel_core.watch", "accel_core.metrics_http")


def test_cli_modules_load_nothing_the_first_register_does_not_need() -> None:
    code = ("import sys, json, efa_plugin.cli, neuron_dra.deviceplugin.cli; "
            f"print(json.dumps([m for m in {list(HEAVY)!r} if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert json.loads(out.stdout) == []


def test_dra_driver_clis_leave_the_webhook_and_explain_servers_to_their_commands() -> None:
    """``serve`` never needs the admission webhook's HTTP server (aiohttp, about a third of the import time of a
    driver start) nor the explain command's explainer and CEL evaluator: they load with their own commands (every
    command builds the parser)."""
    heavy = ("aiohttp", "accel_core.dra.webhookserver", "cel", "accel_core.dra.explain",
             "accel_core.dra.explain_report")
    code = ("import sys, json, efa_plugin.dra.cli as e, neuron_dra.dra.cli as n; e.CLI.parser(); n.CLI.parser(); "
            f"print(json.dumps([m for m in {heavy!r} if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert json.loads(out.stdout) == []


def test_neuron_registers_both_then_sends_the_full_lists(short_tmp: Path) -> None:
    async def scenario() -> tuple[int, int]:
        fake = copy_host(short_tmp / "host", "trn2.48xlarge")
        standin = KubeletStandIn(short_tmp / "kubelet")
        await standin.start(pod_resources=True)
        stop = asyncio.Event()
        task = asyncio.create_task(service(standin.paths(host_root=fake.root),
                                           ServeOptions(retry_interval=0.2)).run(stop))
        try:
            await standin.wait_registered("aws.amazon.com/neuron")
            await standin.wait_registered("aws.amazon.com/neuroncore")
            chips = await standin.wait_devices("aws.amazon.com/neuron", lambda d: len(d) > 0)
            cores = await standin.wait_devices("aws.amazon.com/neuroncore", lambda d: len(d) > 0)
            first = standin.plugins["aws.amazon.com/neuron"].updates
            assert first == 1, "the first list sent is already the complete one"
            return len(chips), len(cores)
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)
            await standin.stop()

    # trn2.48xlarge: 16 Trainium2 chips of 8 physical NeuronCores; LNC=2 by default -> 4 logical cores a chip
    assert asyncio.run(scenario()) == (16, 64)


def test_neuron_does_not_register_early_while_the_dra_driver_is(short_tmp: Path) -> None:
    async def scenario() -> list[str]:
        fake = copy_host(short_tmp / "host", "inf2.48xlarge")
        standin = KubeletStandIn(short_tmp / "kubelet")
        await standin.start(pod_resources=True)
        standin.registry_dir.mkdir(parents=True, exist_ok=True)
        paths = standin.paths(host_root=fake.root)
        options = ServeOptions(retry_interval=0.2)
        plugin = service(paths, options)
        servers = plugin.servers
        stop = asyncio.Event()
        with socket.socket(socket.AF_UNIX) as sock:  # a real unix socket, as the DRA driver leaves it
            sock.bind(str(standin.registry_dir / "neuron.aws.com-reg.sock"))
            task = asyncio.create_task(plugin.run(stop))
            try:
                await until(lambda: all(s.first_round.is_set() for s in servers), "both first rounds")
                return list(standin.registrations)
            finally:
                stop.set()
                await asyncio.wait_for(task, 10)
                await standin.stop()

    assert asyncio.run(scenario()) == [], "no registration before the first scan while the DRA driver holds the node"
