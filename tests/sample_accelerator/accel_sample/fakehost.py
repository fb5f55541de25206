"""The sample's share of a fake host: ``saccN`` for a type with a ``sacc`` catalog section, and a mutation."""

from __future__ import annotations

from accel_core.fakehost.parts import HostPart, Writer
from accel_sample.facts import SaccSection


class SaccPart(HostPart):
    """Writes ``saccN`` for a type with a ``sacc`` section; ``set_sacc_health(i, "fault")`` flips one."""

    def write(self, w: Writer) -> None:
        s: SaccSection | None = self.spec.section("sacc")
        for i in range(s.devices if s else 0):
            assert s is not None
            d = f"sys/devices/virtual/sample_accel/sacc{i}"
            w.files(d, {"dev": f"{s.major}:{i}\n", "numa_node": f"{i * s.numa_nodes // s.devices}\n",
                        "health": "ok\n", "model": f"{s.model}\n"})
            w.link(f"sys/class/sample_accel/sacc{i}", d)
            w.file(f"dev/sacc{i}", "")

    def set_sacc_health(self, index: int, state: str) -> None:
        self.host.replace(f"sys/devices/virtual/sample_accel/sacc{index}/health", f"{state}\n")
