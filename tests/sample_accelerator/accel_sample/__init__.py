"""A made-up accelerator, "sacc": devices ``/sys/class/sample_accel/saccN`` (``dev``, ``numa_node`` and a
``health`` file reading ``ok`` or ``fault``) and ``/dev/saccN``. Its device plugin serves ``example.com/sacc``,
its DRA driver ``sacc.example.com``. This declaration is all the project learns of it."""

from accel_core.registry import Accelerator, Daemon

RESOURCE = "example.com/sacc"
SOCKET = "sacc-device-plugin.sock"
DRIVER = "sacc.example.com"
PLUGIN = Daemon("sample-device-plugin", "accel_sample.plugin:main", metrics_port=9830, read_only=("ls",))
DRA = Daemon("sample-dra-driver", "accel_sample.dra:main", metrics_port=9831, health_port=51530)

ACCELERATOR = Accelerator(
    name="sample", packages=("accel_sample",), daemons=(PLUGIN, DRA),
    catalog_sections={"sacc": "accel_sample.facts:SaccSection"}, catalog_file="accel_sample:instances.yaml",
    fakehost="accel_sample.fakehost:SaccPart",
)
