"""EFA's one declaration (entry point ``efa`` of group ``aws_accel_agents.accelerators``): its catalog sections and
file, fake-host part, daemons, console scripts and ports. Imports nothing heavy: the daemons read their ports here."""

from accel_core.registry import Accelerator, Daemon

DEVICE_PLUGIN = Daemon("efa-device-plugin", "efa_plugin.cli:main", metrics_port=9810,
                       read_only=("ls", "--output", "json"))
DRA_DRIVER = Daemon("efa-dra-driver", "efa_plugin.dra.cli:main", metrics_port=9813, health_port=51516,
                    read_only=("slices", "--node-name", "n1"))

ACCELERATOR = Accelerator(
    name="efa",
    packages=("efa_plugin",),
    daemons=(DEVICE_PLUGIN, DRA_DRIVER),
    catalog_sections={"efa": "efa_plugin.facts:EfaSection", "other_rdma": "efa_plugin.facts:OtherRdmaList",
                      "gpus": "efa_plugin.facts:GpuSection"},
    catalog_file="efa_plugin:instances.yaml",
    fakehost="efa_plugin.fakehost:EfaPart",
)
