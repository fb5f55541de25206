"""Neuron's one declaration (entry point ``neuron`` of group ``aws_accel_agents.accelerators``): its catalog
section and file, fake-host part, daemons, console scripts and ports. Imports nothing heavy: the daemons read their
ports here."""

from accel_core.registry import Accelerator, Daemon

DEVICE_PLUGIN = Daemon("neuron-device-plugin", "neuron_dra.deviceplugin.cli:main", metrics_port=9811,
                       read_only=("ls",))
DRA_DRIVER = Daemon("neuron-dra-driver", "neuron_dra.dra.cli:main", metrics_port=9812, health_port=51515,
                    read_only=("slices", "--node-name", "n1"))
#: a Deployment in the pod network (its own IP), so its port is no node daemon's concern
EXTENDER = Daemon("neuron-scheduler-extender", "neuron_dra.extender.cli:main", metrics_port=9813, on_node=False)

ACCELERATOR = Accelerator(
    name="neuron",
    packages=("neuron_dra",),
    daemons=(DEVICE_PLUGIN, DRA_DRIVER, EXTENDER),
    catalog_sections={"neuron": "neuron_dra.facts.catalog:NeuronSection"},
    catalog_file="neuron_dra.facts:instances.yaml",
    fakehost="neuron_dra.fakehost:NeuronPart",
)
