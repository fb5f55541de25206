"""Topology-aware preferred allocation: whole PCIe roots / Neuron groups first, then NUMA, then the rest."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest
from hostcache import copy_host

from accel_core.awsfacts import catalog
from accel_core.paths import HostPaths
from efa_plugin.allocation import Topology, topology_path
from efa_plugin.discovery import EfaDevice, discover
from efa_plugin.facts import neuron_efa_map


def catalog_devices(instance_type: str) -> list[EfaDevice]:
    """EFA records straight from the catalog (what discovery returns for that type; see test_efa_discovery)."""
    spec = catalog.get(instance_type)
    assert spec.efa is not None
    neurons = neuron_efa_map(spec)
    out = []
    for i, d in enumerate(spec.efa.devices):
        out.append(EfaDevice(
            id=d.pci.bdf, ibdev=d.ibdev, uverbs=f"uverbs{i}", device_node=f"/dev/infiniband/uverbs{i}",
            major=231, minor=192 + i, pci_address=d.pci.bdf, pcie_root=d.pci.root,
            numa_node=d.pci.numa_node if d.pci.numa_node >= 0 else None, port_states=((1, "ACTIVE"),),
            sysfs_dir=Path("/nonexistent"),
            near_neurons=tuple(sorted(n for n, bdf in neurons.items() if bdf == d.pci.bdf)),
        ))
    return out


def roots_of(topo: Topology, ids: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for i in ids:
        out[topo.group_of[i]] = out.get(topo.group_of[i], 0) + 1
    return out


#: p5.48xlarge's 32 EFAs as AWS names them (efa.md 2.2: rdmap{79-82,96-99,113-116,130-133,147-150,164-167,181-184,
#: 198-201}s0, 8 groups of 4 consecutive buses), each group sharing a PCIe root with one GPU (efa.md 2.3, "four
#: EFA devices that share the same PCIe root with one GPU"). Written here, not read from the catalog.
P5_GROUP_FIRST_BUS = (79, 96, 113, 130, 147, 164, 181, 198)
P5_GROUPS = tuple(tuple(f"rdmap{bus}s0" for bus in range(first, first + 4)) for first in P5_GROUP_FIRST_BUS)


@pytest.fixture(scope="module")
def p5() -> Topology:
    return Topology(catalog_devices("p5.48xlarge"))


@pytest.fixture(scope="module")
def p5_groups() -> list[list[str]]:
    """The facts' groups as device IDs, in the facts' order (each group's IDs sorted)."""
    by_ibdev = {d.ibdev: d.id for d in catalog_devices("p5.48xlarge")}
    return [sorted(by_ibdev[ibdev] for ibdev in group) for group in P5_GROUPS]


def ibdev_groups(topo: Topology, devices: list[EfaDevice]) -> set[frozenset[str]]:
    ibdev = {d.id: d.ibdev for d in devices}
    return {frozenset(ibdev[i] for i in members) for members in topo.groups().values()}


def test_p5_groups_are_the_eight_gpu_roots(p5: Topology) -> None:
    assert ibdev_groups(p5, catalog_devices("p5.48xlarge")) == {frozenset(g) for g in P5_GROUPS}


@pytest.mark.parametrize("size, roots", [(4, 1), (8, 2), (12, 3), (16, 4), (32, 8)])
def test_p5_multiples_of_four_get_whole_roots(p5: Topology, size: int, roots: int) -> None:
    got = p5.preferred(sorted(p5.known), [], size)
    assert len(got) == size == len(set(got))
    assert sorted(roots_of(p5, got).values()) == [4] * roots


def test_p5_two_roots_stay_on_one_numa_node(p5: Topology) -> None:
    got = p5.preferred(sorted(p5.known), [], 8)
    numa = {topology_path(d)[0] for d in catalog_devices("p5.48xlarge") if d.id in got}
    assert len(numa) == 1


def test_p5_small_request_finishes_a_broken_root_first(p5: Topology, p5_groups: list[list[str]]) -> None:
    groups = p5_groups
    # root 5 has one device in use; a request for 2 must come from it, leaving 7 roots whole
    available = [i for i in sorted(p5.known) if i != groups[5][0]]
    got = p5.preferred(available, [], 2)
    assert set(got) <= set(groups[5])
    # best fit among broken roots: the one with fewest free devices that still fits
    available = [i for i in available if i not in groups[2][:2]]
    assert set(p5.preferred(available, [], 2)) <= set(groups[2])
    assert set(p5.preferred(available, [], 3)) <= set(groups[5])


def test_p5_whole_root_beats_two_broken_roots(p5: Topology, p5_groups: list[list[str]]) -> None:
    groups = p5_groups
    # roots 0-6 have 2 free each; root 7 is whole: a request for 4 takes root 7, not 2+2
    available = [g[i] for g in groups[:7] for i in (0, 1)] + groups[7]
    got = p5.preferred(available, [], 4)
    assert sorted(got) == groups[7]
    assert sorted(available)[:4] != groups[7], "the four lowest IDs (first fit) split roots here"


def test_must_include_is_honoured_and_its_root_filled(p5: Topology, p5_groups: list[list[str]]) -> None:
    groups = p5_groups
    must = [groups[3][2]]
    got = p5.preferred(sorted(p5.known), must, 4)
    assert must[0] in got
    assert sorted(got) == groups[3]
    # must_include spread over two roots: both roots are used before any third
    must = [groups[1][0], groups[6][0]]
    got = p5.preferred(sorted(p5.known), must, 8)
    assert set(must) <= set(got)
    assert set(roots_of(p5, got)) == {p5.group_of[must[0]], p5.group_of[must[1]]}


def test_must_include_larger_than_size_and_unknown_ids(p5: Topology) -> None:
    ids = sorted(p5.known)
    assert p5.preferred(ids, ids[:3], 2) == ids[:3]
    got = p5.preferred(ids + ["ghost"], ["ghost"], 5)
    assert got[0] == "ghost" and len(got) == 5 and len(roots_of(p5, got[1:])) == 1
    # fewer available than asked for: everything available, unknown IDs last
    assert p5.preferred(ids[:2] + ["zz"], [], 4) == [*ids[:2], "zz"]


def test_numa_before_the_rest(p5: Topology, p5_groups: list[list[str]]) -> None:
    devices = catalog_devices("p5.48xlarge")
    groups = p5_groups
    # NUMA 0: roots 0-3 each with 1 free; NUMA 1: roots 4-7 each with 1 free. A request for 2 spans 2 roots either
    # way; it must stay on one NUMA node.
    available = [g[0] for g in groups]
    got = p5.preferred(available, [], 2)
    assert len({d.numa_node for d in devices if d.id in got}) == 1


def test_p5en_two_per_gpu_root_and_p4d_one_per_root() -> None:
    p5en = Topology(catalog_devices("p5en.48xlarge"))
    got = p5en.preferred(sorted(p5en.known), [], 2)
    assert list(roots_of(p5en, got).values()) == [2]
    p4d = Topology(catalog_devices("p4d.24xlarge"))
    got = p4d.preferred(sorted(p4d.known), [], 2)
    assert len(roots_of(p4d, got)) == 2
    numa = {d.numa_node for d in catalog_devices("p4d.24xlarge") if d.id in got}
    assert len(numa) == 1, "two single-EFA roots on the same NUMA node"


def test_trn1_prefers_the_same_neuron_group_over_the_pcie_root() -> None:
    devices = catalog_devices("trn1.32xlarge")
    topo = Topology(devices)
    got = topo.preferred(sorted(topo.known), [], 2)
    neurons = sorted(n for d in devices if d.id in got for n in d.near_neurons)
    assert neurons == [0, 1, 2, 3], "the two EFAs serving Neuron devices 0-3 (roots 10 and a0)"
    assert len({d.pcie_root for d in devices if d.id in got}) == 2
    got = topo.preferred(sorted(topo.known), [], 4)
    assert sorted(n for d in devices if d.id in got for n in d.near_neurons) == list(range(8))


def test_trn2_group_of_four_neurons() -> None:
    devices = catalog_devices("trn2.48xlarge")
    topo = Topology(devices)
    for must_neuron in (5, 10):
        must = [d.id for d in devices if must_neuron in d.near_neurons]
        got = topo.preferred(sorted(topo.known), must, 4)
        first = must_neuron // 4 * 4
        assert sorted(n for d in devices if d.id in got for n in d.near_neurons) == list(range(first, first + 4))


def test_unknown_placement_still_allocates() -> None:
    devices = [dataclasses.replace(d, numa_node=None, pcie_root=None) for d in catalog_devices("p4d.24xlarge")]
    topo = Topology(devices)
    got = topo.preferred(sorted(topo.known), [], 3)
    assert got == sorted(topo.known)[:3]


def test_property_p5_random_sequences_whole_roots(tmp_path: Path) -> None:
    """On the discovered p5 inventory: every k x 4 request made while >= k whole roots are free gets whole roots."""
    copy_host(tmp_path / "host", "p5.48xlarge")
    inventory = list(discover(HostPaths(host_root=tmp_path / "host")).devices)
    topo = Topology(inventory)
    groups = topo.groups()
    assert ibdev_groups(topo, inventory) == {frozenset(g) for g in P5_GROUPS}
    rng = random.Random(20240611)
    checked = 0
    for _sequence in range(200):
        free = set(topo.known)
        held: list[list[str]] = []
        for _step in range(30):
            if held and (rng.random() < 0.4 or len(free) < 4):
                free.update(held.pop(rng.randrange(len(held))))
                continue
            size = rng.choice([1, 2, 3, 4, 4, 8, 8, 12, 16, 5, 6])
            if size > len(free):
                continue
            available = sorted(free)
            rng.shuffle(available)  # the kubelet's order carries no meaning
            whole = [g for g, members in groups.items() if set(members) <= free]
            must = rng.sample(available, 1) if rng.random() < 0.1 else []
            got = topo.preferred(available, must, size)
            assert len(got) == size == len(set(got)) and set(got) <= free and set(must) <= set(got)
            if size % 4 == 0 and len(whole) >= size // 4 and not must:
                counts = roots_of(topo, got)
                assert sorted(counts.values()) == [4] * (size // 4), (size, counts)
                checked += 1
            free.difference_update(got)
            held.append(got)
    assert checked > 500


def test_remembered_answers_equal_fresh_ones_and_cannot_be_altered_by_callers() -> None:
    rng = random.Random(7)
    topo = Topology(catalog_devices("p5.48xlarge"))
    ids = sorted(topo.known)
    for _ in range(200):
        available = rng.sample(ids, rng.randint(1, len(ids)))
        must = rng.sample(available, rng.randint(0, min(3, len(available))))
        size = rng.randint(max(1, len(must)), len(available))
        first = topo.preferred(available, must, size)
        first.append("tampered")  # a caller mutating its answer must not change the next one
        again = topo.preferred(list(reversed(available)), must, size)  # same set, other order: same question
        fresh = Topology(catalog_devices("p5.48xlarge")).preferred(available, must, size)
        assert again == fresh, (available, must, size)
        assert set(must) <= set(again) and len(again) == size


def test_an_impossible_size_is_not_programmed(p5: Topology, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 25 item 3: the programme's tables grow with the size asked (1e6 took 5.65 s, 2**31-1 ~23 GB); more
    than the free devices cannot be met, so it is not run, and the answer is every device."""
    original = Topology._options
    ids = sorted(p5.known)

    def spy(self: Topology, node: object, free: set[str], must: set[str], cap: int) -> object:
        assert cap <= len(ids), f"programme run for {cap} devices"  # before its tables are built
        return original(self, node, free, must, cap)  # type: ignore[arg-type]

    monkeypatch.setattr(Topology, "_options", spy)
    assert p5.preferred(ids, [], 2**31 - 1) == ids
    assert p5.preferred(ids[:5] + ["zz"], [], 10**6) == [*ids[:5], "zz"]
    assert p5.preferred(ids, [], 4) == p5.preferred(ids, [], 4)
