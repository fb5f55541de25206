"""Fake-sysfs host mode: a catalog of AWS instance types and a generator of their ``/sys``/``/dev`` trees.

``build_host(root, "p5.48xlarge")`` writes the tree and returns a :class:`FakeHost` whose methods mutate it
(remove/restore devices, corruption, and each accelerator part's own: port state, counters). Layout reference:
docs/fake-sysfs.md.
"""

from accel_core.awsfacts.catalog import CatalogError, InstanceType, UnknownInstanceType
from accel_core.fakehost.builder import build_host, clear_host, default_boot_id
from accel_core.fakehost.fsops import FakeHostError
from accel_core.fakehost.host import FakeHost

__all__ = [
    "CatalogError",
    "FakeHost",
    "FakeHostError",
    "InstanceType",
    "UnknownInstanceType",
    "build_host",
    "clear_host",
    "default_boot_id",
]
