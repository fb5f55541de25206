"""Issue 25 item 8: ``neuron-device-plugin --kubeconfig /etc/passwd`` says so in one line and keeps serving; its
Node publisher no longer dies silently."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from accel_rig.kubelet_standin import KubeletStandIn
from accel_rig.polling import until
from hostcache import copy_host
from waits import logged

from neuron_dra.deviceplugin.options import ServeOptions
from neuron_dra.deviceplugin.start import service


def test_a_kubeconfig_that_is_no_kubeconfig_is_logged_and_serving_goes_on(
        short_tmp: Path, caplog: pytest.LogCaptureFixture) -> None:
    passwd = short_tmp / "passwd"
    passwd.write_text("root:x:0:0:root:/root:/bin/bash\n")

    async def scenario() -> None:
        fake = copy_host(short_tmp / "host", "inf2.xlarge")
        standin = KubeletStandIn(short_tmp / "kubelet")
        await standin.start(pod_resources=True)
        options = ServeOptions(node_name="n1", kubeconfig=str(passwd), retry_interval=0.2,
                               pod_resources_interval=0.1, pod_resources_idle_interval=0.1)
        stop = asyncio.Event()
        task = asyncio.create_task(service(standin.paths(host_root=fake.root), options).run(stop))
        try:
            await standin.wait_registered("aws.amazon.com/neuron", timeout=30)
            await until(logged(caplog, f"--kubeconfig {passwd}: not a usable kubeconfig"), "the kubeconfig error")
            await standin.wait_devices("aws.amazon.com/neuron", lambda d: len(d) == 1)
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)  # a shutdown without the publisher's error
            await standin.stop()

    caplog.set_level(logging.INFO)
    asyncio.run(scenario())
    assert not [r for r in caplog.records if "background task died" in r.getMessage()]
