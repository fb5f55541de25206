"""Disk full (ENOSPC injected at each write) and hostile claim UIDs through the core DRA handler.

After every failure, in every order, the checkpoint and the CDI directory agree: each claim recorded as prepared
has its spec (or no answer names it: a prepare re-creates it first), no claim answered has no spec, and what a new
process reads from disk is what the driver answered. ENOSPC is raised by the write functions themselves (the
journal's ``pwrite``, the snapshot's and the CDI spec's atomic writes, the spec's create), as the kernel does on
a full filesystem; no tmpfs can be mounted here.
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path
from typing import Any

import pytest
from dracalls import DictClaimReader, prepare, prepare_one, unprepare_one
from hostcache import shared_host

import accel_core.dra.cdi as cdi_module
import accel_core.dra.checkpoint as checkpoint_module
from accel_core.dra.cdi import CdiSpecWriter
from accel_core.dra.checkpoint import read_boot_id
from accel_core.dra.preparation import CDI_CLASS, DraDriver, cdi_vendor
from accel_core.dra.store import ClaimStore
from accel_core.dra.types import ClaimError, ClaimRef
from accel_core.paths import HostPaths
from efa_plugin.dra.profile import EfaProfile

NODE = "node-a"
DRIVER = "efa.aws.com"


def _full(*_: Any, **__: Any) -> Any:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class Rig:
    """One EFA driver on a p5 fake host; ``full(checkpoint=..., cdi=..., unlink=...)`` makes writes fail."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        host = shared_host("p5.48xlarge")
        self.monkeypatch = monkeypatch
        self.paths = HostPaths(host_root=host.root, kubelet_root=tmp_path / "kubelet", cdi_root=tmp_path / "cdi",
                               device_plugins=tmp_path / "kubelet" / "device-plugins")
        self.profile = EfaProfile()
        scan = self.profile.scan(self.paths, "1.0.0")
        self.inventory = scan.inventory
        self.devices = [d.name for d in scan.devices]
        self.reader = DictClaimReader()
        self.restart()

    def restart(self) -> None:
        self.store = ClaimStore(self.paths.plugins_data_dir / DRIVER / "checkpoint.json",
                                read_boot_id(self.paths.host_root))
        self.store.load()
        self.cdi = CdiSpecWriter(self.paths.cdi_root, cdi_vendor(DRIVER), CDI_CLASS)
        self.driver = DraDriver(self.profile, node_name=NODE, reader=self.reader, cdi=self.cdi, store=self.store,
                                inventory=lambda: self.inventory)

    def claim(self, name: str, index: int) -> ClaimRef:
        uid = f"uid-{name}"
        results = [{"request": "nic", "driver": DRIVER, "pool": NODE, "device": self.devices[index]}]
        self.reader.claims[("ns", name)] = {"metadata": {"namespace": "ns", "name": name, "uid": uid},
                                            "status": {"allocation": {"devices": {"results": results}}}}
        return ClaimRef("ns", uid, name)

    def full(self, *, checkpoint: bool = False, cdi: bool = False, unlink: bool = False) -> None:
        """Make the checkpoint's writes, the CDI spec writes or the spec removals fail (ENOSPC; EIO to remove);
        with no argument every write works again."""
        mp, journal, root = self.monkeypatch, self.store.file, str(self.paths.cdi_root)

        def pwrite(fd: int, data: bytes, offset: int) -> int:
            if checkpoint and fd == journal._fd:
                _full()
            return REAL["pwrite"](fd, data, offset)

        def remove(path: Any, *args: Any, **kwargs: Any) -> None:
            if unlink and str(path).startswith(root):
                raise OSError(errno.EIO, os.strerror(errno.EIO), str(path))
            REAL["unlink"](path, *args, **kwargs)

        mp.setattr(os, "pwrite", pwrite)
        mp.setattr(os, "unlink", remove)
        for name in ("atomic_write_text", "atomic_write_bytes"):
            mp.setattr(checkpoint_module, name, _full if checkpoint else REAL[f"checkpoint.{name}"])
        mp.setattr(cdi_module, "_create", _full if cdi else REAL["cdi._create"])
        mp.setattr(cdi_module, "atomic_write_text", _full if cdi else REAL["cdi.atomic_write_text"])

    def consistent(self) -> None:
        """The CDI directory and the checkpoint agree, in this process and in a new one reading the disk."""
        fresh = ClaimStore(self.store.path, self.store.boot_id)
        fresh.load()
        fresh.file.close()
        assert fresh.error is None
        for store in (self.store, fresh):
            recorded = {c.uid for c in store.claims()}
            assert set(self.cdi.spec_ids()) == recorded, "a spec without an entry, or an entry without a spec"
            for claim in store.claims():
                assert self.cdi.matches(claim.uid, claim.cdi_devices())


#: The write functions as they are, before a test makes them fail.
REAL: dict[str, Any] = {"pwrite": os.pwrite, "unlink": os.unlink,
                        "checkpoint.atomic_write_text": checkpoint_module.atomic_write_text,
                        "checkpoint.atomic_write_bytes": checkpoint_module.atomic_write_bytes,
                        "cdi._create": cdi_module._create, "cdi.atomic_write_text": cdi_module.atomic_write_text}


@pytest.fixture
def rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Rig:
    return Rig(tmp_path, monkeypatch)


# -- unprepare ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("journaled", [True, False], ids=["journal-record", "snapshot"])
def test_unprepare_with_the_checkpoint_full_keeps_the_claim_prepared_with_its_spec(rig: Rig, journaled: bool) -> None:
    ref = rig.claim("a", 0)
    devices = prepare_one(rig.driver, ref)
    if not journaled:
        rig.store.file._rewrite = True  # the next change writes a snapshot (as after a failed journal write)
    rig.full(checkpoint=True)
    with pytest.raises(ClaimError, match=r"cannot update checkpoint .*No space left on device; the claim stays "
                                         r"prepared \(CDI spec put back\)"):
        unprepare_one(rig.driver, ref)
    assert rig.store.get(ref.uid) is not None
    rig.consistent()
    assert prepare_one(rig.driver, ref) == devices  # a kubelet retry of prepare: the same answer, the spec there
    rig.full()  # space is back: the kubelet's retry of unprepare succeeds
    unprepare_one(rig.driver, ref)
    assert rig.store.get(ref.uid) is None
    rig.consistent()


def test_unprepare_with_the_checkpoint_full_fails_only_the_claims_that_stay_prepared(rig: Rig) -> None:
    ref, unknown = rig.claim("a", 0), ClaimRef("ns", "uid-never-prepared", "b")
    prepare_one(rig.driver, ref)
    rig.full(checkpoint=True)
    hostile = ClaimRef("ns", "x" * 300, "c")
    out = rig.driver.unprepare_blocking([ref, unknown, hostile])
    assert isinstance(out[ref.uid], ClaimError) and out[unknown.uid] is None and out[hostile.uid] is None
    rig.consistent()


def test_unprepare_with_both_full_leaves_an_entry_whose_spec_a_prepare_recreates_first(rig: Rig) -> None:
    ref = rig.claim("a", 0)
    devices = prepare_one(rig.driver, ref)
    rig.full(checkpoint=True, cdi=True)
    with pytest.raises(ClaimError, match=r"its CDI spec is re-created before a prepare answers"):
        unprepare_one(rig.driver, ref)
    assert rig.store.get(ref.uid) is not None and not rig.cdi.exists(ref.uid)
    with pytest.raises(ClaimError, match="cannot re-create the CDI spec"):  # never CDI ids without a spec
        prepare_one(rig.driver, ref)
    with pytest.raises(ClaimError, match=f"device {rig.devices[0]} is already prepared for claim ns/a"):
        rig.full()
        prepare_one(rig.driver, rig.claim("b", 0))  # the entry still holds its device
    assert prepare_one(rig.driver, ref) == devices and rig.cdi.exists(ref.uid)
    rig.consistent()


def test_a_restart_after_both_were_full_recreates_the_spec(rig: Rig) -> None:
    ref = rig.claim("a", 0)
    prepare_one(rig.driver, ref)
    rig.full(checkpoint=True, cdi=True)
    with pytest.raises(ClaimError):
        unprepare_one(rig.driver, ref)
    rig.full()
    rig.restart()
    assert rig.driver.restore() == [ref.uid]
    rig.consistent()


def test_unprepare_whose_spec_cannot_be_removed_keeps_both(rig: Rig) -> None:
    ref = rig.claim("a", 0)
    prepare_one(rig.driver, ref)
    rig.full(unlink=True)
    with pytest.raises(ClaimError, match="cannot remove CDI spec .*the claim stays prepared"):
        unprepare_one(rig.driver, ref)
    assert rig.store.get(ref.uid) is not None
    rig.consistent()


# -- prepare -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["checkpoint", "cdi", "checkpoint-then-unlink"])
def test_prepare_with_a_full_disk_records_nothing_and_answers_no_ids(rig: Rig, where: str) -> None:
    ref = rig.claim("a", 0)
    rig.full(checkpoint=where.startswith("checkpoint"), cdi=where == "cdi", unlink=where.endswith("unlink"))
    result = prepare(rig.driver, [ref])[ref.uid]
    assert isinstance(result, ClaimError)
    assert "No space left on device" in str(result)
    assert rig.store.get(ref.uid) is None
    rig.full()
    if where.endswith("unlink"):  # an orphan spec no answer named: start removes it
        assert rig.cdi.spec_ids() == [ref.uid]
        rig.restart()
        assert rig.driver.remove_orphan_specs() == [ref.uid]
    rig.consistent()
    assert [d.device for d in prepare_one(rig.driver, ref)] == [rig.devices[0]]  # the kubelet's retry
    rig.consistent()


def test_prepare_of_a_recorded_claim_recreates_a_missing_spec_before_answering(rig: Rig) -> None:
    ref = rig.claim("a", 0)
    devices = prepare_one(rig.driver, ref)
    os.unlink(rig.cdi.spec_path(ref.uid))
    assert prepare_one(rig.driver, ref) == devices
    rig.consistent()


# -- hostile UIDs --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("length", [300, 100_000])
def test_unprepare_of_a_uid_that_is_no_kubernetes_uid_is_a_no_op(rig: Rig, length: int,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    ref = rig.claim("a", 0)
    prepare_one(rig.driver, ref)
    hostile = ClaimRef("ns", "a" * length, "a")
    caplog.set_level(logging.DEBUG)
    assert rig.driver.unprepare_blocking([hostile, ref]) == {hostile.uid: None, ref.uid: None}
    assert all(len(r.getMessage()) < 1000 and r.exc_info is None for r in caplog.records)
    assert all(len(str(getattr(r, "claim", ""))) < 300 for r in caplog.records)
    rig.consistent()


@pytest.mark.parametrize("uid", ["a" * 300, "a" * 100_000, "../x", "-a"])
def test_prepare_of_a_uid_that_is_no_kubernetes_uid_fails_that_claim_only(rig: Rig, uid: str) -> None:
    good = rig.claim("a", 0)
    result = prepare(rig.driver, [ClaimRef("ns", uid, "a"), good])
    assert isinstance(result[uid], ClaimError) and "is not a UID" in str(result[uid])
    assert len(str(result[uid])) < 300
    assert not isinstance(result[good.uid], Exception)
    rig.consistent()


def test_cdi_names_no_file_for_an_overlong_id(tmp_path: Path) -> None:
    cdi = CdiSpecWriter(tmp_path, "k8s.efa.aws.com", "claim")
    assert not cdi.remove("a" * 300) and not cdi.exists("a" * 300)
