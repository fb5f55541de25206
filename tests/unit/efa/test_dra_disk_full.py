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
from drarig import DriverRig, host_paths
from hostcache import shared_host

import accel_core.dra.cdi as cdi_module
import accel_core.dra.checkpoint as checkpoint_module
from accel_core.dra.cdi import CdiSpecWriter
from accel_core.dra.store import ClaimStore
from accel_core.dra.types import ClaimError, ClaimRef
from efa_plugin.dra.profile import EfaProfile


def _full(*_: Any, **__: Any) -> Any:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class Rig(DriverRig):
    """One EFA driver on a p5 fake host; ``full(checkpoint=..., cdi=..., unlink=...)`` makes writes fail."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.monkeypatch = monkeypatch
        super().__init__(host_paths(tmp_path, shared_host("p5.48xlarge").root), EfaProfile())

    def claim(self, name: str, index: int) -> ClaimRef:
        return self.add(name, [self.devices[index]], request="nic")

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
        mp.setattr(cdi_module, "create_file", _full if cdi else REAL["cdi.create_file"])
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
                        "cdi.create_file": cdi_module.create_file,
                        "cdi.atomic_write_text": cdi_module.atomic_write_text}


@pytest.fixture
def rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Rig:
    return Rig(tmp_path, monkeypatch)


# -- unprepare ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("journaled", [True, False], ids=["journal-record", "snapshot"])
def test_unprepare_with_the_checkpoint_full_keeps_the_claim_prepared_with_its_spec(rig: Rig, journaled: bool) -> None:
    ref = rig.claim("a", 0)
    devices = rig.prepare_one(ref)
    if not journaled:
        rig.store.file._rewrite = True  # the next change writes a snapshot (as after a failed journal write)
    rig.full(checkpoint=True)
    with pytest.raises(ClaimError, match=r"cannot update checkpoint .*No space left on device; the claim stays "
                                         r"prepared \(CDI spec put back\)"):
        rig.unprepare_one(ref)
    assert rig.store.get(ref.uid) is not None
    rig.consistent()
    assert rig.prepare_one(ref) == devices  # a kubelet retry of prepare: the same answer, the spec there
    rig.full()  # space is back: the kubelet's retry of unprepare succeeds
    rig.unprepare_one(ref)
    assert rig.store.get(ref.uid) is None
    rig.consistent()


def test_unprepare_with_the_checkpoint_full_fails_only_the_claims_that_stay_prepared(rig: Rig) -> None:
    ref, unknown = rig.claim("a", 0), ClaimRef("ns", "uid-never-prepared", "b")
    rig.prepare_one(ref)
    rig.full(checkpoint=True)
    hostile = ClaimRef("ns", "x" * 300, "c")
    out = rig.unprepare(ref, unknown, hostile)
    assert isinstance(out[ref.uid], ClaimError) and out[unknown.uid] is None and out[hostile.uid] is None
    rig.consistent()


def test_unprepare_with_both_full_leaves_an_entry_whose_spec_a_prepare_recreates_first(rig: Rig) -> None:
    ref = rig.claim("a", 0)
    devices = rig.prepare_one(ref)
    rig.full(checkpoint=True, cdi=True)
    with pytest.raises(ClaimError, match=r"its CDI spec is re-created before a prepare answers"):
        rig.unprepare_one(ref)
    assert rig.store.get(ref.uid) is not None and not rig.cdi.exists(ref.uid)
    with pytest.raises(ClaimError, match="cannot re-create the CDI spec"):  # never CDI ids without a spec
        rig.prepare_one(ref)
    with pytest.raises(ClaimError, match=f"device {rig.devices[0]} is already prepared for claim ns/a"):
        rig.full()
        rig.prepare_one(rig.claim("b", 0))  # the entry still holds its device
    assert rig.prepare_one(ref) == devices and rig.cdi.exists(ref.uid)
    rig.consistent()


def test_a_restart_after_both_were_full_recreates_the_spec(rig: Rig) -> None:
    ref = rig.claim("a", 0)
    rig.prepare_one(ref)
    rig.full(checkpoint=True, cdi=True)
    with pytest.raises(ClaimError):
        rig.unprepare_one(ref)
    rig.full()
    rig.restart()
    assert rig.restored == [ref.uid]
    rig.consistent()


def test_unprepare_whose_spec_cannot_be_removed_keeps_both(rig: Rig) -> None:
    ref = rig.claim("a", 0)
    rig.prepare_one(ref)
    rig.full(unlink=True)
    with pytest.raises(ClaimError, match="cannot remove CDI spec .*the claim stays prepared"):
        rig.unprepare_one(ref)
    assert rig.store.get(ref.uid) is not None
    rig.consistent()


# -- prepare -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["checkpoint", "cdi", "checkpoint-then-unlink"])
def test_prepare_with_a_full_disk_records_nothing_and_answers_no_ids(rig: Rig, where: str) -> None:
    ref = rig.claim("a", 0)
    rig.full(checkpoint=where.startswith("checkpoint"), cdi=where == "cdi", unlink=where.endswith("unlink"))
    result = rig.prepare(ref)[ref.uid]
    assert isinstance(result, ClaimError)
    assert "No space left on device" in str(result)
    assert rig.store.get(ref.uid) is None
    rig.full()
    if where.endswith("unlink"):  # an orphan spec no answer named: start removes it
        assert rig.cdi.spec_ids() == [ref.uid]
        rig.restart()
        assert rig.orphans == [ref.uid]
    rig.consistent()
    assert [d.device for d in rig.prepare_one(ref)] == [rig.devices[0]]  # the kubelet's retry
    rig.consistent()


def test_prepare_of_a_recorded_claim_recreates_a_missing_spec_before_answering(rig: Rig) -> None:
    ref = rig.claim("a", 0)
    devices = rig.prepare_one(ref)
    os.unlink(rig.cdi.spec_path(ref.uid))
    assert rig.prepare_one(ref) == devices
    rig.consistent()


# -- hostile UIDs --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("length", [300, 100_000])
def test_unprepare_of_a_uid_that_is_no_kubernetes_uid_is_a_no_op(rig: Rig, length: int,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    ref = rig.claim("a", 0)
    rig.prepare_one(ref)
    hostile = ClaimRef("ns", "a" * length, "a")
    caplog.set_level(logging.DEBUG)
    assert rig.unprepare(hostile, ref) == {hostile.uid: None, ref.uid: None}
    assert all(len(r.getMessage()) < 1000 and r.exc_info is None for r in caplog.records)
    assert all(len(str(getattr(r, "claim", ""))) < 300 for r in caplog.records)
    rig.consistent()


@pytest.mark.parametrize("uid", ["a" * 300, "a" * 100_000, "../x", "-a"])
def test_prepare_of_a_uid_that_is_no_kubernetes_uid_fails_that_claim_only(rig: Rig, uid: str) -> None:
    good = rig.claim("a", 0)
    result = rig.prepare(ClaimRef("ns", uid, "a"), good)
    assert isinstance(result[uid], ClaimError) and "is not a UID" in str(result[uid])
    assert len(str(result[uid])) < 300
    assert not isinstance(result[good.uid], Exception)
    rig.consistent()


def test_cdi_names_no_file_for_an_overlong_id(tmp_path: Path) -> None:
    cdi = CdiSpecWriter(tmp_path, "k8s.efa.aws.com", "claim")
    assert not cdi.remove("a" * 300) and not cdi.exists("a" * 300)
