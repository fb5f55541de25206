"""Preferred allocation: connected device sets (property test over random allocate/free), core packing, edits."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from neuron_facts import TRN2_LINKS, connected, well_placed_on_torus, well_placed_sets_within

from neuron_dra.allocation import choose_cores, choose_devices
from neuron_dra.edits import container_edits, format_core_list, visible_cores
from neuron_dra.topology import Topology

TORUS = Topology.regular("torus4x4", 16)


SIZES = [1, 2, 3, 4, 5, 8, 12, 16]
# A step either requests ``size`` devices or releases the held set at ``index`` (modulo the number held).
Step = tuple[str, int]
STEPS = st.lists(st.one_of(st.tuples(st.just("request"), st.sampled_from(SIZES)),
                           st.tuples(st.just("release"), st.integers(0, 15))), max_size=40)


@settings(max_examples=150, deadline=None)
@given(STEPS)
def test_property_a_well_placed_set_whenever_one_is_free(steps: list[Step]) -> None:
    """trn2.48xlarge, any allocate/free sequence: when the free devices hold a connected set that fits one documented
    group (neuron.md section 3), the allocator returns such a set; otherwise it says why it could not."""
    free = set(range(16))
    held: list[tuple[int, ...]] = []
    for action, n in steps:
        if action == "release":
            if held:
                free.update(held.pop(n % len(held)))
            continue
        if n > len(free):
            continue
        choice = choose_devices(TORUS, sorted(free), (), n)
        assert len(choice.ids) == n and set(choice.ids) <= free
        if well_placed_sets_within(free, n):
            assert choice.connected and well_placed_on_torus(choice.ids), (sorted(free), n, choice)
        else:
            assert not choice.connected and choice.reason
        free.difference_update(choice.ids)
        held.append(choice.ids)


def test_aligned_groups_and_best_fit() -> None:
    assert choose_devices(TORUS, range(16), (), 4).ids == (0, 1, 2, 3)
    assert choose_devices(TORUS, range(16), (), 8).ids == tuple(range(8))
    # device 0 is taken: a single device goes into the already broken row, keeping rows 1..3 whole
    assert choose_devices(TORUS, range(1, 16), (), 1).ids == (1,)
    assert choose_devices(TORUS, range(1, 16), (), 4).ids == (4, 5, 6, 7)
    # rows 0 and 2 are broken: eight devices can only be rows 2..3 or 0..1 -> neither is free, fall back
    free = set(range(16)) - {0, 9}
    choice = choose_devices(TORUS, free, (), 8)
    assert not choice.connected and "no free connected set of 8" in choice.reason
    assert len(choice.ids) == 8 and connected(choice.ids, TRN2_LINKS)
    # a pair goes next to other used devices, inside a broken row
    assert set(choose_devices(TORUS, free, (), 2).ids) <= {1, 2, 3, 8, 10, 11}


def test_must_include_is_honoured() -> None:
    choice = choose_devices(TORUS, range(16), [6], 4)
    assert choice.ids == (4, 5, 6, 7) and choice.connected
    choice = choose_devices(TORUS, range(16), [3, 4], 4)
    assert set(choice.ids) >= {3, 4} and len(choice.ids) == 4 and not choice.connected
    assert choose_devices(TORUS, range(16), [1, 2, 3], 2).ids == (1, 2, 3)


def test_ring_runs_pack_against_used_devices() -> None:
    ring = Topology.regular("ring", 12)
    assert choose_devices(ring, range(12), (), 3).ids == (0, 1, 2)
    free = set(range(12)) - {5}
    choice = choose_devices(ring, free, (), 2)
    assert choice.connected and (set(choice.ids) in ({3, 4}, {6, 7}))
    wrap = choose_devices(ring, {10, 11, 0, 1, 4}, (), 4)
    assert wrap.connected and set(wrap.ids) == {10, 11, 0, 1}
    chain = Topology.regular("chain", 6)
    assert not choose_devices(chain, {5, 0, 2}, (), 2).connected


def test_single_and_unconnected_nodes() -> None:
    single = Topology.regular("single", 1)
    assert choose_devices(single, [0], (), 1).ids == (0,)
    none = Topology("none", 3, ((), (), ()))
    choice = choose_devices(none, [0, 1, 2], (), 2)
    assert len(choice.ids) == 2 and not choice.connected


# ----------------------------------------------------------------------------------------------- cores


def test_cores_pack_onto_a_partly_used_device() -> None:
    # trn2 LNC 2: 4 logical cores per device; device 0 has cores 0,1 in use
    free = set(range(64)) - {0, 1}
    choice = choose_cores(TORUS, 4, free, (), 2)
    assert choice.ids == (2, 3) and choice.connected


def test_cores_contiguous_within_a_device() -> None:
    free = set(range(8, 64)) | {0, 2, 3}  # device 0 has 0,2,3 free
    assert choose_cores(TORUS, 4, free, (), 2).ids == (2, 3)
    assert choose_cores(TORUS, 4, free, (), 3).ids == (0, 2, 3)  # tightest device that fits


def test_cores_spanning_devices_use_a_connected_set() -> None:
    choice = choose_cores(TORUS, 8, range(128), (), 32)  # LNC 1: 8 cores per device -> one torus row
    assert choice.ids == tuple(range(32)) and choice.connected
    free = set(range(128)) - set(range(8))  # device 0 in use
    choice = choose_cores(TORUS, 8, free, (), 32)
    assert choice.ids == tuple(range(32, 64)) and choice.connected
    choice = choose_cores(TORUS, 8, free, (), 12)
    assert len({c // 8 for c in choice.ids}) == 2 and len(choice.ids) == 12


def test_cores_with_must_include() -> None:
    choice = choose_cores(TORUS, 4, range(64), [5], 3)
    assert choice.ids == (4, 5, 6) and choice.connected


@pytest.mark.parametrize("seed", range(5))
def test_cores_random_requests_are_valid(seed: int) -> None:
    rng = random.Random(seed)
    free = set(range(128))
    for _ in range(60):
        if not free:
            break
        size = rng.randint(1, min(20, len(free)))
        choice = choose_cores(TORUS, 8, sorted(free), (), size)
        assert len(choice.ids) == size and set(choice.ids) <= free
        used_devices = {c // 8 for c in choice.ids}
        assert len(used_devices) >= -(-size // 8)
        free.difference_update(choice.ids)


# ----------------------------------------------------------------------------------------------- edits


def test_format_core_list() -> None:
    assert format_core_list([0, 1, 2, 3, 6, 8, 9]) == "0-3,6,8-9"
    assert format_core_list([5]) == "5"
    assert format_core_list([]) == ""


def test_visible_cores_container_numbering() -> None:
    # host cores 18,19 = device 4 cores 2,3 at 4 per device: the container sees one device -> 2,3
    assert visible_cores([18, 19], 4) == [2, 3]
    # devices 3 and 5 -> container devices 0 and 1
    assert visible_cores([13, 21], 4) == [1, 5]
    assert visible_cores([13, 21], 4, "host") == [13, 21]


def test_container_edits() -> None:
    edits = container_edits([5, 4], list(range(16, 24)), cores_per_device=4, lnc=2)
    assert [n.path for n in edits.device_nodes] == ["/dev/neuron4", "/dev/neuron5"]
    assert all(n.host_path == n.path for n in edits.device_nodes)
    assert edits.env_dict() == {"NEURON_RT_VISIBLE_CORES": "0-7", "NEURON_LOGICAL_NC_CONFIG": "2"}
    assert "NEURON_LOGICAL_NC_CONFIG" not in container_edits([0], [0, 1], cores_per_device=2, lnc=None).env_dict()
