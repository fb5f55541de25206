"""The Neuron DRA handler without sockets: prepare/unprepare, CDI contents, idempotency, conflicts, checkpoint
restore after a restart or a reboot, fail-closed behaviour on a corrupt checkpoint, and the stale-claim cleanup."""

from __future__ import annotations

import asyncio
import json
import logging
import multiprocessing
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from cdi_oracle import assert_cdi_accepts
from drarig import DriverRig, host_paths
from drarig import claim as api_claim
from hostcache import copy_host, shared_host
from lightkube.resources.resource_v1 import ResourceClaim
from prometheus_client import CollectorRegistry

from accel_core import atomic
from accel_core.dra import checkpoint
from accel_core.dra.cdi import CdiError
from accel_core.dra.checkpoint import Checkpoint, CheckpointFile, read_boot_id
from accel_core.dra.cleanup import StaleClaimCleaner
from accel_core.dra.metrics import DriverMetrics
from accel_core.dra.prepared import STATE_COMPLETED, STATE_STARTED
from accel_core.dra.types import ClaimError, ClaimRef
from accel_core.edits import ContainerEdits
from accel_core.fakehost import FakeHost
from neuron_dra.dra.profile import NeuronProfile
from neuron_dra.edits import CoreNumbering

NODE = "node-a"
LNC1 = {"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCore": 1}


def make_claim(uid: str, devices: list[int], *, name: str | None = None, request: str = "neurons",
               configs: list[dict[str, Any]] | None = None, pool: str = NODE) -> dict[str, Any]:
    return api_claim(name or f"claim-{uid}", [f"neuron-device-{i}" for i in devices], driver="neuron.aws.com",
                     uid=uid, request=request, configs=configs or [], pool=pool)


class Rig(DriverRig):
    """A fake host plus a driver wired to it; ``restart()`` builds a new driver on the same files."""

    def __init__(self, root: Path, instance_type: str = "trn2.48xlarge", *, own_host: bool = False,
                 core_numbering: CoreNumbering = "container") -> None:
        # The driver writes only below kubelet/ and cdi/: a test that changes the host asks for its own copy.
        self.host: FakeHost = copy_host(root / "host", instance_type) if own_host else shared_host(instance_type)
        super().__init__(host_paths(root, self.host.root), NeuronProfile(core_numbering=core_numbering))

    def prepare_checked(self, ref: ClaimRef) -> Any:
        """Prepare; then containerd's CDI library must load the whole CDI root and resolve every returned ID."""
        devices = self.prepare_one(ref)
        assert_cdi_accepts(self.paths.cdi_root, [i for d in devices for i in d.cdi_device_ids])
        return devices

    def spec(self, uid: str) -> dict[str, Any]:
        data = self.cdi.read(uid)
        assert data is not None, f"no CDI spec for {uid}"
        assert_cdi_accepts(self.paths.cdi_root)
        return data


def _device_nodes(spec: dict[str, Any]) -> list[str]:
    return [n["path"] for d in spec["devices"] for n in d["containerEdits"].get("deviceNodes", [])]


def _env(spec: dict[str, Any]) -> dict[str, str]:
    return dict(e.split("=", 1) for d in spec["devices"] for e in d["containerEdits"].get("env", []))


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return Rig(tmp_path)


def test_prepare_all_devices_writes_cdi_spec(rig: Rig) -> None:
    ref = rig.claims.add(make_claim("u-all", list(range(16))))
    devices = rig.prepare_checked(ref)
    assert [d.device for d in devices] == [f"neuron-device-{i}" for i in range(16)]
    assert all(d.pool == NODE and d.request_names == ("neurons",) for d in devices)
    assert devices[0].cdi_device_ids == ("k8s.neuron.aws.com/claim=u-all-neuron-device-0",
                                         "k8s.neuron.aws.com/claim=u-all-request-neurons")
    assert devices[1].cdi_device_ids == ("k8s.neuron.aws.com/claim=u-all-neuron-device-1",)
    spec = rig.spec("u-all")
    assert spec["kind"] == "k8s.neuron.aws.com/claim"
    assert rig.cdi.spec_path("u-all").name == "k8s.neuron.aws.com-claim_u-all.json"
    assert _device_nodes(spec) == [f"/dev/neuron{i}" for i in range(16)]
    assert _env(spec) == {"NEURON_RT_VISIBLE_CORES": "0-63"}  # trn2 default LNC 2: 4 logical cores per device
    assert rig.store.get("u-all").state == STATE_COMPLETED  # type: ignore[union-attr]


def test_lnc_1_claim_and_a_torus_row(rig: Rig) -> None:
    lnc1 = rig.claims.add(make_claim("u-lnc", list(range(16)), configs=[
        {"source": "FromClaim", "requests": ["neurons"], "opaque": {"driver": "neuron.aws.com", "parameters": LNC1}}]))
    rig.prepare_checked(lnc1)
    assert _env(rig.spec("u-lnc")) == {"NEURON_RT_VISIBLE_CORES": "0-127", "NEURON_LOGICAL_NC_CONFIG": "1"}
    rig.unprepare_one(lnc1)
    row = rig.claims.add(make_claim("u-row", [4, 5, 6, 7]))
    rig.prepare_checked(row)
    spec = rig.spec("u-row")
    assert _device_nodes(spec) == ["/dev/neuron4", "/dev/neuron5", "/dev/neuron6", "/dev/neuron7"]
    # the container sees only /dev/neuron4-7, so its runtime numbers their cores from 0
    assert _env(spec) == {"NEURON_RT_VISIBLE_CORES": "0-15"}


def test_host_core_numbering_reaches_the_cdi_spec(tmp_path: Path) -> None:
    """``--core-numbering host`` (for runtimes before 2.16) on the DRA path, as on the device plugin's: trn2 has 8
    NeuronCores per device, 4 logical ones at the default LNC 2, so devices 4-7 hold host cores 16-31."""
    rig = Rig(tmp_path, core_numbering="host")
    row = rig.claims.add(make_claim("u-row", [4, 5, 6, 7]))
    rig.prepare_checked(row)
    assert _env(rig.spec("u-row")) == {"NEURON_RT_VISIBLE_CORES": "16-31"}
    status = NeuronProfile(core_numbering="host").container_edits(rig.inventory, "r", ["neuron-device-5"],
                                                                  NeuronProfile.default_config).status
    assert status["neuron-device-5"].data["visibleCores"] == "20-23"


def test_prepare_is_idempotent_and_refuses_devices_of_another_claim(rig: Rig) -> None:
    ref = rig.claims.add(make_claim("u-1", [0, 1, 2, 3]))
    first = rig.prepare_checked(ref)
    again = rig.prepare_checked(ref)
    assert first == again
    assert rig.claims.reads == 1, "a prepared claim is answered from the checkpoint"
    other = rig.claims.add(make_claim("u-2", [3, 4], name="other"))
    with pytest.raises(ClaimError, match=r"neuron-device-3 is already prepared for claim ns/claim-u-1 \(uid u-1\)"):
        rig.prepare_checked(other)
    assert rig.store.get("u-2") is None and not rig.cdi.exists("u-2")
    rig.unprepare_one(ref)
    assert rig.prepare_checked(other)[0].device == "neuron-device-3"


def test_unprepare_is_idempotent_and_needs_no_api(rig: Rig) -> None:
    ref = rig.claims.add(make_claim("u-1", [0]))
    rig.prepare_checked(ref)
    rig.claims.claims.clear()  # the claim is deleted from the API server
    reads = rig.claims.reads
    rig.unprepare_one(ref)
    rig.unprepare_one(ref)
    rig.unprepare_one(ClaimRef("ns", "never-seen", "ghost"))
    assert rig.claims.reads == reads
    assert not rig.cdi.exists("u-1") and rig.store.get("u-1") is None
    assert CheckpointFile(rig.store.path).load().claims == {}, "a restarted driver finds no entry"


def test_restart_restores_claims_and_recreates_missing_cdi_specs(rig: Rig) -> None:
    ref = rig.claims.add(make_claim("u-1", [8, 9]))
    before = rig.prepare_checked(ref)
    rig.cdi.remove("u-1")  # lost (e.g. /var/run cleared)
    rig.restart()
    assert rig.loaded.claims == 1 and not rig.loaded.rebooted
    assert rig.restored == ["u-1"]
    assert _device_nodes(rig.spec("u-1")) == ["/dev/neuron8", "/dev/neuron9"]
    reads = rig.claims.reads
    assert rig.prepare_checked(ref) == before
    assert rig.claims.reads == reads
    # a prepared claim's spec lost while running is re-created by the next (idempotent) prepare
    rig.cdi.remove("u-1")
    rig.prepare_checked(ref)
    assert rig.cdi.exists("u-1")


def test_reboot_is_detected_and_specs_recreated(tmp_path: Path) -> None:
    rig = Rig(tmp_path, own_host=True)
    ref = rig.claims.add(make_claim("u-1", [0]))
    rig.prepare_checked(ref)
    rig.cdi.remove("u-1")
    rig.host.set_boot_id("11111111-2222-3333-4444-555555555555")
    rig.restart()
    assert rig.loaded.rebooted
    assert rig.restored == ["u-1"]
    body = json.loads(rig.store.path.read_text())["body"]
    assert body["bootId"] == "11111111-2222-3333-4444-555555555555"


def test_failed_cdi_write_records_nothing(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    ref = rig.claims.add(make_claim("u-1", [2]))

    def disk_full(*args: Any, **kwargs: Any) -> list[str]:
        raise CdiError("cannot write CDI spec: No space left on device")

    with monkeypatch.context() as m:
        m.setattr(rig.cdi, "write", disk_full)
        with pytest.raises(ClaimError, match="cannot record the prepared claim: .*No space left"):
            rig.prepare_checked(ref)
    assert rig.store.get("u-1") is None  # nothing was answered, so nothing is reserved
    rig.restart()
    assert rig.store.get("u-1") is None and not rig.cdi.exists("u-1")
    rig.prepare_checked(ref)  # the kubelet's retry completes it
    assert rig.store.get("u-1").state == STATE_COMPLETED  # type: ignore[union-attr]
    assert rig.cdi.exists("u-1")


def test_failed_checkpoint_write_removes_the_spec(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    ref = rig.claims.add(make_claim("u-1", [2]))

    def disk_full(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(os, "fdatasync", disk_full)  # the journal record's sync
        m.setattr(rig.store.file, "save", disk_full)  # and a snapshot, should the journal be full
        with pytest.raises(ClaimError, match=r"cannot record the prepared claim in checkpoint .*No space left"):
            rig.prepare_checked(ref)
    assert rig.store.get("u-1") is None and not rig.cdi.exists("u-1")
    other = rig.claims.add(make_claim("u-2", [2], name="other"))
    assert rig.prepare_checked(other)[0].device == "neuron-device-2"


# Where a SIGKILL lands in a one-claim prepare, and whether the claim is then recorded (the checkpoint decides):
# around the CDI spec's write, around its journal record's write and sync, and, when the journal is full and a
# snapshot is written instead, around the snapshot's rename and its directory's sync. A record written but not yet
# synced survives a killed process (the page cache outlives it); only a power loss could drop it, and then the
# kubelet never had an answer either.
KILL_POINTS = {
    "cdi-spec-created": ("spec-write", "before", False),
    "cdi-spec-written": ("spec-write", "after", False),
    "journal-record-written": ("journal-write", "after", True),
    "journal-record-synced": ("journal-sync", "after", True),
    "snapshot-temp-synced": ("snapshot", "before", False),
    "snapshot-renamed": ("snapshot", "after", True),
    "snapshot-dir-synced": ("snapshot-dir", "after", True),
}


def _prepare_then_die(rig: Rig, ref: ClaimRef, target: str, when: str) -> None:
    """In a forked child: run the prepare and SIGKILL this process around the chosen write, rename or sync."""
    spec, snapshot = str(rig.cdi.spec_path(ref.uid)), str(rig.store.path)
    journal = str(rig.store.file.journal_path)
    real_replace, real_sync_dir, real_write = os.replace, atomic.fsync_dir, os.write
    real_pwrite, real_fdatasync = os.pwrite, os.fdatasync

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    def names(fd: int, path: str) -> bool:
        return os.readlink(f"/proc/self/fd/{fd}") == path

    def replace(src: Any, dst: Any) -> None:
        hit = target == "snapshot" and str(dst) == snapshot
        if hit and when == "before":
            die()
        real_replace(src, dst)
        if hit:
            die()

    def sync_dir(directory: Path) -> None:
        real_sync_dir(directory)
        if target == "snapshot-dir" and Path(directory) == rig.store.path.parent:
            die()

    def write(fd: int, data: Any) -> int:
        hit = target == "spec-write" and names(fd, spec)
        if hit and when == "before":
            die()
        written = real_write(fd, data)
        if hit:
            die()
        return written

    def pwrite(fd: int, data: Any, offset: int) -> int:
        written = real_pwrite(fd, data, offset)
        if target == "journal-write" and names(fd, journal):
            die()
        return written

    def fdatasync(fd: int) -> None:
        real_fdatasync(fd)
        if target == "journal-sync" and names(fd, journal):
            die()

    if target.startswith("snapshot"):
        checkpoint.JOURNAL_BYTES = 1  # type: ignore[misc]  # the journal is full: the change goes to a snapshot
    os.replace = replace  # type: ignore[assignment]
    atomic.fsync_dir = sync_dir  # type: ignore[assignment]
    os.write, os.pwrite, os.fdatasync = write, pwrite, fdatasync  # type: ignore[assignment]
    rig.prepare_checked(ref)
    os._exit(3)  # the kill point was never reached


@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_a_kill_anywhere_in_a_prepare_is_repaired_at_start(rig: Rig, point: str) -> None:
    """A real SIGKILL of a process in the middle of a prepare; the next start (same files) must leave no orphan
    spec and no temp file, and either no trace of the claim (the kubelet got no answer and prepares it again) or a
    completed entry with its spec and its devices held."""
    target, when, recorded = KILL_POINTS[point]
    ref = rig.claims.add(make_claim("u-1", [2]))
    rig.prepare_checked(rig.claims.add(make_claim("u-0", [0], name="earlier")))  # a claim prepared before stays intact
    child = multiprocessing.get_context("fork").Process(target=_prepare_then_die, args=(rig, ref, target, when))
    child.start()
    child.join(60)
    assert child.exitcode == -signal.SIGKILL, f"the child was not killed at {point} (exit code {child.exitcode})"
    rig.restart()
    assert not list(rig.paths.cdi_root.glob(".tmp-*")) and not list(rig.store.path.parent.glob(".tmp-*"))
    entries = {c.uid for c in rig.store.claims()}
    assert set(rig.cdi.spec_ids()) == entries, "every spec has an entry and every entry a spec"
    for claim in rig.store.claims():
        assert rig.cdi.matches(claim.uid, claim.cdi_devices())
    assert "u-0" in entries and ("u-1" in entries) == recorded
    other = rig.claims.add(make_claim("u-2", [2], name="other"))
    if "u-1" in entries:
        with pytest.raises(ClaimError, match="already prepared"):
            rig.prepare_checked(other)
        reads = rig.claims.reads
        assert rig.prepare_checked(ref)[0].device == "neuron-device-2" and rig.claims.reads == reads
    else:
        assert rig.prepare_checked(other)[0].device == "neuron-device-2", "the device was never handed out"


def test_start_removes_orphan_specs_and_rewrites_damaged_ones(rig: Rig) -> None:
    ref = rig.claims.add(make_claim("u-1", [1]))
    rig.prepare_checked(ref)
    good = rig.cdi.spec_path("u-1").read_text()
    rig.cdi.spec_path("u-1").write_text(good[: len(good) // 2])  # as a power loss could leave it
    orphan = rig.cdi.spec_path("u-gone")
    orphan.write_text(good)
    foreign = rig.paths.cdi_root / "k8s.other.example.com-claim_u-x.json"  # another driver's spec: not ours
    foreign.write_text(good)
    rig.restart()
    assert rig.restored == ["u-1"] and rig.orphans == ["u-gone"]
    assert rig.cdi.spec_path("u-1").read_text() == good
    assert not orphan.exists() and foreign.exists()


def test_orphan_specs_stay_while_the_checkpoint_is_unusable(rig: Rig) -> None:
    rig.prepare_checked(rig.claims.add(make_claim("u-1", [1])))
    rig.store.path.write_text("garbage")
    rig.restart()
    assert rig.store.error and rig.orphans == [] and rig.cdi.exists("u-1")


def test_a_started_entry_of_an_older_version_keeps_its_devices(rig: Rig) -> None:
    """``PrepareStarted`` (written by earlier versions before the CDI spec) still reserves the devices, its spec
    is no orphan, and the kubelet's retry completes it."""
    ref = rig.claims.add(make_claim("u-1", [2]))
    _started_entry(rig, ref, 2)
    rig.cdi.write("u-1", [("u-1-neuron-device-2", ContainerEdits(env=(("NEURON_RT_VISIBLE_CORES", "8-11"),)))])
    rig.restart()
    assert rig.orphans == [] and rig.cdi.exists("u-1")
    other = rig.claims.add(make_claim("u-2", [2], name="other"))
    with pytest.raises(ClaimError, match="already prepared"):
        rig.prepare_checked(other)
    rig.prepare_checked(ref)
    assert rig.store.get("u-1").state == STATE_COMPLETED  # type: ignore[union-attr]


def _started_entry(rig: Rig, ref: ClaimRef, device: int) -> None:
    """A ``PrepareStarted`` entry as an earlier version wrote it before the CDI spec."""
    entry = {"state": STATE_STARTED, "namespace": ref.namespace, "name": ref.name, "pool": NODE,
             "requests": [{"name": "neurons", "devices": [f"neuron-device-{device}"], "deviceEdits": {},
                           "edits": {}}]}
    CheckpointFile(rig.store.path).save(Checkpoint(read_boot_id(rig.paths.host_root), {ref.uid: entry}))


@pytest.mark.parametrize("damage", ["deleted", "emptied", "truncated-after-record-1", "zeroed-tail"])
def test_a_journal_that_lost_records_while_stopped_hands_out_no_device_twice(rig: Rig, damage: str) -> None:
    """Issue 25 item 2, as reported: with the driver stopped the journal lost its second record; the driver then
    gave that claim's device (neuron-device-10) to a new claim. Now it refuses to prepare, naming the journal."""
    rig.prepare_checked(rig.claims.add(make_claim("u-0", [0], name="zero")))  # the first change writes a snapshot
    rig.prepare_checked(rig.claims.add(make_claim("u-1", [1], name="one")))  # journal record 1
    held = rig.claims.add(make_claim("u-2", [10], name="two"))
    assert rig.prepare_checked(held)[0].device == "neuron-device-10"  # journal record 2: answered to the kubelet
    rig.store.file.close()
    journal = rig.store.file.journal_path
    data = journal.read_bytes()
    after_first = data.index(b"\n") + 1
    if damage == "deleted":
        journal.unlink()
    elif damage == "emptied":
        journal.write_bytes(b"")
    else:
        os.truncate(journal, after_first)
        if damage == "zeroed-tail":
            os.truncate(journal, len(data))
    rig.restart()
    assert rig.store.error and "checkpoint.journal" in rig.store.error
    thief = rig.claims.add(make_claim("u-3", [10], name="three"))
    with pytest.raises(ClaimError, match=r"checkpoint .*checkpoint.json is unusable \(journal .*checkpoint\.journal"):
        rig.prepare_checked(thief)


def test_corrupt_checkpoint_fails_closed_for_prepare_only(rig: Rig) -> None:
    ref = rig.claims.add(make_claim("u-1", [0]))
    rig.prepare_checked(ref)
    rig.store.path.write_text('{"checksum": "0", "body": {}}')
    rig.restart()
    assert rig.store.error and "checksum" in rig.store.error
    new = rig.claims.add(make_claim("u-2", [5], name="new"))
    with pytest.raises(ClaimError, match=r"checkpoint .*checkpoint.json is unusable"):
        rig.prepare_checked(new)
    rig.unprepare_one(ref)  # lenient: removes the CDI spec, no error
    assert not rig.cdi.exists("u-1")


@pytest.mark.parametrize(("claim", "pattern"), [
    (None, "does not exist"),
    ({**make_claim("other-uid", [0]), "metadata": {"namespace": "ns", "name": "c", "uid": "other-uid"}},
     "replaced: the API server has UID other-uid"),
    ({"metadata": {"namespace": "ns", "name": "c", "uid": "u-x"}, "status": {}}, "not allocated"),
    ({**make_claim("u-x", [0], pool="node-b"), "metadata": {"namespace": "ns", "name": "c", "uid": "u-x"}},
     "no devices of neuron.aws.com in pool node-a .*neuron.aws.com/node-b"),
    ({**make_claim("u-x", [16]), "metadata": {"namespace": "ns", "name": "c", "uid": "u-x"}},
     "neuron-device-16 \\(request neurons\\) is not a Neuron device of this node"),
    ({**make_claim("u-x", [0], configs=[{"source": "FromClaim", "opaque": {
        "driver": "neuron.aws.com", "parameters": {**LNC1, "bogus": 1}}}]),
      "metadata": {"namespace": "ns", "name": "c", "uid": "u-x"}}, "unknown field 'bogus'"),
])
def test_claim_errors(rig: Rig, claim: dict[str, Any] | None, pattern: str) -> None:
    if claim is not None:
        rig.claims.claims[("ns", "c")] = claim
    with pytest.raises(ClaimError, match=pattern):
        rig.prepare_checked(ClaimRef("ns", "u-x", "c"))
    assert rig.store.claims() == []


def test_lnc_on_a_generation_without_lnc_is_an_error(tmp_path: Path) -> None:
    rig = Rig(tmp_path, "trn1.32xlarge")
    ref = rig.claims.add(make_claim("u-1", [0], configs=[
        {"source": "FromClaim", "opaque": {"driver": "neuron.aws.com", "parameters": LNC1}}]))
    with pytest.raises(ClaimError, match=r"logicalNeuronCore: 1 is set, but trn1.32xlarge \(Trainium1\) has no"):
        rig.prepare_checked(ref)
    plain = rig.claims.add(make_claim("u-2", [1, 2], name="plain"))
    rig.prepare_checked(plain)
    assert _env(rig.spec("u-2")) == {"NEURON_RT_VISIBLE_CORES": "0-3"}  # trn1: 2 cores per device


def test_missing_device_cannot_be_prepared_and_health_reports_it(tmp_path: Path) -> None:
    rig = Rig(tmp_path, own_host=True)
    rig.host.remove_neuron(6)
    rig.rescan()
    ref = rig.claims.add(make_claim("u-1", [6]))
    with pytest.raises(ClaimError, match="neuron-device-6 .*not present"):
        rig.prepare_checked(ref)
    reports = {r.device: r for r in rig.driver.health() or []}
    assert len(reports) == 16
    assert reports["neuron-device-6"].healthy is False and "neuron6" in reports["neuron-device-6"].message
    assert reports["neuron-device-0"].healthy is True and reports["neuron-device-0"].pool == NODE


# -- stale claim cleanup -----------------------------------------------------------------------------------------------
def clean(rig: Rig) -> tuple[list[tuple[str, str]], CollectorRegistry]:
    """One cleanup pass through a DRA plugin's serialized unprepare; returns (uid, reason) pairs and the metrics."""
    registry = CollectorRegistry()

    async def one_pass() -> list[tuple[str, str]]:
        cleaner = StaleClaimCleaner(store=rig.store, reader=rig.reader, unprepare=rig.plugin.unprepare_claims,
                                    driver="neuron.aws.com", pool=NODE, metrics=DriverMetrics(registry, "neuron_dra"))
        return [(c.ref.uid, c.staleness.reason) for c in await cleaner.clean_once()]

    return asyncio.run(one_pass()), registry


def cleaned_count(registry: CollectorRegistry, reason: str) -> float | None:
    return registry.get_sample_value("neuron_dra_stale_claims_cleaned_total", {"reason": reason})


def _deleted(rig: Rig) -> None:
    del rig.claims.claims[("ns", "claim-u-1")]


def _replaced(rig: Rig) -> None:
    rig.claims.add(make_claim("u-new", [2], name="claim-u-1"))


def _deallocated(rig: Rig) -> None:
    rig.claims.claims[("ns", "claim-u-1")]["status"] = {}


def _allocated_elsewhere(rig: Rig) -> None:
    rig.claims.add(make_claim("u-1", [2], pool="node-b"))


@pytest.mark.parametrize(("change", "reason"), [
    (_deleted, "deleted"), (_replaced, "replaced"), (_deallocated, "not_allocated"),
    (_allocated_elsewhere, "allocated_elsewhere"),
])
def test_cleanup_unprepares_stale_claims_and_keeps_live_ones(
        rig: Rig, change: Any, reason: str, caplog: pytest.LogCaptureFixture) -> None:
    stale = rig.claims.add(make_claim("u-1", [2, 3]))
    live = rig.claims.add(make_claim("u-live", [4]))
    rig.prepare_checked(stale)
    rig.prepare_checked(live)
    change(rig)
    with caplog.at_level(logging.INFO, logger="accel_core.dra.cleanup"):
        cleaned, registry = clean(rig)
    assert cleaned == [("u-1", reason)]
    assert rig.store.get("u-1") is None and not rig.cdi.exists("u-1")
    assert rig.store.get("u-live") is not None and rig.cdi.exists("u-live")
    assert cleaned_count(registry, reason) == 1
    [record] = [r for r in caplog.records if r.name == "accel_core.dra.cleanup"]
    assert record.getMessage() == "unprepared stale claim"
    fields = record.__dict__["kv"]
    assert fields["claim"] == "ns/claim-u-1 (uid u-1)" and fields["reason"] == reason
    other = rig.claims.add(make_claim("u-2", [2, 3], name="other"))
    rig.prepare_checked(other)  # the devices are free again
    assert rig.store.get("u-2").state == STATE_COMPLETED  # type: ignore[union-attr]


def test_cleanup_never_touches_live_claims(rig: Rig) -> None:
    refs = [rig.claims.add(make_claim("u-1", [0, 1])), rig.claims.add(make_claim("u-2", [5], name="two"))]
    for ref in refs:
        rig.prepare_checked(ref)
    before = rig.store.path.read_bytes()
    cleaned, registry = clean(rig)
    assert cleaned == []
    assert rig.store.path.read_bytes() == before
    assert rig.cdi.exists("u-1") and rig.cdi.exists("u-2")
    assert cleaned_count(registry, "deleted") is None


def test_cleanup_keeps_everything_when_the_api_server_fails(
        rig: Rig, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    refs = [rig.claims.add(make_claim("u-1", [0])), rig.claims.add(make_claim("u-2", [1], name="two"))]
    for ref in refs:
        rig.prepare_checked(ref)
    rig.claims.claims.clear()  # even claims that look deleted are kept while the server cannot be read

    def unavailable(namespace: str, name: str) -> ResourceClaim | None:
        raise ClaimError("reading the claim from the API server failed: HTTP 503: unavailable")

    monkeypatch.setattr(rig.reader, "read", unavailable)
    with caplog.at_level(logging.INFO, logger="accel_core.dra.cleanup"):
        cleaned, _ = clean(rig)
    assert cleaned == []
    assert {c.uid for c in rig.store.claims()} == {"u-1", "u-2"}
    assert rig.cdi.exists("u-1") and rig.cdi.exists("u-2")
    warnings = [r for r in caplog.records if r.name == "accel_core.dra.cleanup"]
    assert len(warnings) == 1 and "HTTP 503" in str(warnings[0].__dict__["kv"]["error"])
    monkeypatch.undo()  # the server is back: the next pass cleans up
    cleaned, _ = clean(rig)
    assert sorted(cleaned) == [("u-1", "deleted"), ("u-2", "deleted")]


def test_cleanup_frees_the_devices_of_an_interrupted_prepare(rig: Rig) -> None:
    ref = rig.claims.add(make_claim("u-1", [2]))
    _started_entry(rig, ref, 2)  # an earlier version was killed mid-prepare
    rig.restart()
    assert rig.store.get("u-1").state == STATE_STARTED  # type: ignore[union-attr]
    other = rig.claims.add(make_claim("u-2", [2], name="other"))
    with pytest.raises(ClaimError, match="already prepared"):
        rig.prepare_checked(other)
    _deleted(rig)
    cleaned, _ = clean(rig)
    assert cleaned == [("u-1", "deleted")]
    assert rig.prepare_checked(other)[0].device == "neuron-device-2"
    assert rig.store.get("u-2").state == STATE_COMPLETED  # type: ignore[union-attr]


def test_batch_prepares_each_claim_like_one_at_a_time(rig: Rig) -> None:
    """One request with several claims: each gets its own devices and CDI spec and a completed checkpoint entry,
    every claim is read once, and a duplicate UID in the request gets one answer."""
    refs = [rig.claims.add(make_claim(f"u-b{i}", [i])) for i in range(4)]
    out = rig.prepare(*refs, refs[0])
    assert set(out) == {r.uid for r in refs}
    assert rig.claims.reads == 4
    for i, ref in enumerate(refs):
        devices = out[ref.uid]
        assert not isinstance(devices, Exception), devices
        assert [d.device for d in devices] == [f"neuron-device-{i}"]
        assert _device_nodes(rig.spec(ref.uid)) == [f"/dev/neuron{i}"]
        assert rig.store.get(ref.uid).state == STATE_COMPLETED  # type: ignore[union-attr]
    rig.restart()  # the entries are on disk, not only in memory
    assert {c.uid for c in rig.store.claims()} == {r.uid for r in refs}


def test_batch_refuses_a_device_claimed_earlier_in_the_same_request(rig: Rig) -> None:
    first = rig.claims.add(make_claim("u-first", [3, 4]))
    second = rig.claims.add(make_claim("u-second", [4]))
    bad = rig.claims.add(make_claim("u-bad", [2], pool="other-node"))
    out = rig.prepare(first, second, bad)
    assert not isinstance(out[first.uid], Exception)
    assert isinstance(out[second.uid], ClaimError) and "neuron-device-4" in str(out[second.uid])
    assert "u-first" in str(out[second.uid])
    assert isinstance(out[bad.uid], ClaimError)
    assert rig.store.get(second.uid) is None and rig.cdi.read(second.uid) is None
    assert rig.store.get(bad.uid) is None


def test_batch_through_the_plugin_answers_every_claim(rig: Rig) -> None:
    """The DRA plugin hands a multi-claim request to the batch path; per-claim errors stay per claim."""
    good = rig.claims.add(make_claim("u-p1", [5]))
    clash = rig.claims.add(make_claim("u-p2", [5]))
    out = rig.answer(good, clash)
    assert out[good.uid][1] == "" and [d.device for d in out[good.uid][0]] == ["neuron-device-5"]
    assert out[clash.uid][0] == [] and "already prepared for claim" in out[clash.uid][1]


def test_two_pods_of_a_rolling_update_share_one_checkpoint(tmp_path: Path) -> None:
    """The old and the new pod of a rolling update both serve (the plugin's file lock takes their requests one at a
    time). Each must see what the other recorded after it started: no device handed out twice, a claim the other
    prepared answered as prepared, a claim the other unprepared free again."""
    old, new = Rig(tmp_path), Rig(tmp_path)  # both loaded the (empty) checkpoint before anything was prepared
    for rig in (old, new):
        rig.claims.add(make_claim("u-1", [2]))
        rig.claims.add(make_claim("u-2", [2], name="other"))
    first, second = ClaimRef("ns", "u-1", "claim-u-1"), ClaimRef("ns", "u-2", "other")
    assert old.prepare_checked(first)[0].device == "neuron-device-2"
    with pytest.raises(ClaimError, match=r"neuron-device-2 is already prepared for claim ns/claim-u-1"):
        new.prepare_checked(second)
    assert new.prepare_checked(first)[0].device == "neuron-device-2", "the other pod's claim gets the same answer"
    new.unprepare_one(first)
    assert old.prepare_checked(second)[0].device == "neuron-device-2", \
        "a claim the other pod unprepared frees its device"
    assert CheckpointFile(old.store.path).load().claims.keys() == {"u-2"}


def test_a_claim_the_other_pod_unprepared_after_the_reads_is_read_under_the_lock(tmp_path: Path) -> None:
    """Reads happen before the lock, judged by what this pod last saw; when the other pod unprepared the claim in
    between, the prepare reads it under the lock instead of answering from a stale entry."""
    old, new = Rig(tmp_path), Rig(tmp_path)
    ref = new.claims.add(make_claim("u-1", [2]))
    new.prepare_checked(ref)
    old.unprepare_one(ref)  # the new pod's memory still holds u-1 as prepared
    reads = new.claims.reads
    out = new.answer(ref)
    assert out["u-1"][1] == "" and [d.device for d in out["u-1"][0]] == ["neuron-device-2"]
    assert new.claims.reads == reads + 1 and new.cdi.exists("u-1")
    assert CheckpointFile(new.store.path).load().claims.keys() == {"u-1"}


def test_a_clean_stop_leaves_a_snapshot_an_older_driver_can_read_alone(tmp_path: Path) -> None:
    """An older driver (a rollback) reads checkpoint.json and knows nothing of the journal: after a clean stop the
    snapshot alone holds every prepared claim, those the other pod of a rolling update recorded included."""
    old, new = Rig(tmp_path), Rig(tmp_path)
    old.prepare_checked(old.claims.add(make_claim("u-1", [1])))
    new.prepare_checked(new.claims.add(make_claim("u-2", [2], name="other")))
    old.store.compact()  # what the service does on a clean stop
    body = json.loads(old.store.path.read_text())["body"]
    assert sorted(body["claims"]) == ["u-1", "u-2"]
    assert {c["requests"][0]["devices"][0] for c in body["claims"].values()} == {"neuron-device-1", "neuron-device-2"}
