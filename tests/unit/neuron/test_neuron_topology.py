"""Topology derivation, torus coordinates and groups, ring/chain runs, catalog cross-check."""

from __future__ import annotations

from itertools import combinations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from neuron_facts import (
    INF2_24_LINKS,
    INF2_48_LINKS,
    TORUS_GROUPS,
    TRN1_LINKS,
    TRN2_LINKS,
    connected,
    smallest_torus_groups,
    well_placed_on_torus,
)

from neuron_dra.topology import (
    Topology,
    TopologyError,
    build_topology,
    classify,
    mask_of,
    members,
    regular_neighbours,
)


def test_classify_regular_shapes() -> None:
    assert classify(TRN2_LINKS) == "torus4x4"
    assert classify([(11, 1)] + [(i - 1, i + 1) for i in range(1, 11)] + [(10, 0)]) == "ring"
    assert classify([(1,), (0, 2), (1, 3), (2, 4), (3, 5), (4,)]) == "chain"
    assert classify([(1,), (0,)]) == "chain"
    assert classify([()]) == "single"
    assert classify([]) == "none"
    assert classify([(), (), ()]) == "none"
    assert classify([(1,), (0, 2), (1,), ()]) is None


def test_torus_coordinates_and_groups() -> None:
    topo, problems = build_topology(TRN2_LINKS, expected_kind="torus4x4")
    assert problems == [] and topo.kind == "torus4x4"
    assert topo.coordinates(0) == (0, 0)
    assert topo.coordinates(6) == (1, 2)
    assert topo.coordinates(15) == (3, 3)
    assert [topo.group_id(i, 4) for i in (0, 3, 4, 11, 12)] == [0, 0, 1, 2, 3]
    assert [topo.group_id(i, 8) for i in (0, 7, 8, 15)] == [0, 0, 1, 1]
    assert {topo.group_id(i, 16) for i in range(16)} == {0}
    assert topo.group_id(9, 1) == 9
    assert topo.connected_groups(4) == [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11), (12, 13, 14, 15)]
    assert topo.connected_groups(8) == [tuple(range(8)), tuple(range(8, 16))]
    assert topo.connected_groups(3) == []
    for size in (1, 4, 8, 16):
        for group in topo.connected_groups(size):
            assert topo.is_connected(group)
    with pytest.raises(TopologyError, match="no connected groups of 2"):
        topo.group_id(0, 2)
    with pytest.raises(TopologyError, match="does not exist"):
        topo.group_id(16, 4)


def test_coordinates_only_on_the_torus() -> None:
    ring = Topology.regular("ring", 12)
    with pytest.raises(TopologyError, match="only on a 4x4 torus"):
        ring.coordinates(0)


def test_ring_and_chain_runs() -> None:
    ring = Topology.regular("ring", 12)
    assert ring.runs(3)[0] == (0, 1, 2)
    assert (10, 11, 0) in ring.runs(3) and (11, 0, 1) in ring.runs(3)
    assert len(ring.runs(3)) == 12 and ring.runs(12) == [tuple(range(12))]
    chain = Topology.regular("chain", 6)
    assert chain.runs(2) == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]
    assert (5, 0) not in chain.runs(2)
    assert chain.group_sizes == (1, 2, 3, 6)
    assert chain.connected_groups(3) == [(0, 1, 2), (3, 4, 5)]


def test_regular_neighbours_are_the_documented_links() -> None:
    assert [set(n) for n in regular_neighbours("torus4x4", 16)] == [set(n) for n in TRN2_LINKS]
    assert [set(n) for n in regular_neighbours("torus4x4", 16)] == [set(n) for n in TRN1_LINKS]
    assert [set(n) for n in regular_neighbours("ring", 12)] == [set(n) for n in INF2_48_LINKS]
    assert [set(n) for n in regular_neighbours("chain", 6)] == [set(n) for n in INF2_24_LINKS]
    assert classify(TRN1_LINKS) == "torus4x4"


def test_connected_groups_are_the_documented_ones() -> None:
    topo = Topology.regular("torus4x4", 16)
    for size, groups in TORUS_GROUPS.items():
        assert [frozenset(g) for g in topo.connected_groups(size)] == groups
        assert [frozenset(members(m)) for m in topo.candidate_masks(size)] == groups


@pytest.mark.parametrize("size", [2, 3, 5, 6, 7, 12, 15])
def test_candidate_sets_are_exactly_the_well_placed_sets(size: int) -> None:
    """Off the group sizes, the candidates are every connected set inside one group of the next documented size."""
    topo = Topology.regular("torus4x4", 16)
    expected = {frozenset(c) for g in smallest_torus_groups(size) for c in combinations(sorted(g), size)
                if connected(c, TRN2_LINKS)}
    assert {frozenset(members(m)) for m in topo.candidate_masks(size)} == expected
    assert all(topo.is_preferred_set(s) for s in expected)


def test_candidate_pairs_and_preferred_examples() -> None:
    topo = Topology.regular("torus4x4", 16)
    pairs = {members(m) for m in topo.candidate_masks(2)}
    assert (0, 1) in pairs and (0, 3) in pairs and (0, 4) not in pairs  # within one row, wrap included
    assert len(pairs) == 16  # 4 rows x 4 links of a 4-ring
    assert topo.is_preferred_set([4, 5, 6, 7]) and not topo.is_preferred_set([2, 3, 4, 5])
    assert topo.is_preferred_set([9]) and not topo.is_preferred_set([0, 5])


@given(st.sets(st.integers(0, 15), min_size=1))
def test_torus_is_connected_by_definition(devices: set[int]) -> None:
    topo = Topology.regular("torus4x4", 16)
    assert topo.is_connected(devices) == connected(devices, TRN2_LINKS)
    assert topo.is_preferred_set(devices) == well_placed_on_torus(devices)


@given(st.sets(st.integers(0, 11), min_size=1))
def test_ring_is_connected_by_definition(devices: set[int]) -> None:
    assert Topology.regular("ring", 12).is_connected(devices) == connected(devices, INF2_48_LINKS)


@given(st.sets(st.integers(0, 5), min_size=1))
def test_chain_is_connected_by_definition(devices: set[int]) -> None:
    assert Topology.regular("chain", 6).is_connected(devices) == connected(devices, INF2_24_LINKS)


def test_catalog_wins_over_irregular_links() -> None:
    links = list(TRN2_LINKS)
    links[3] = (2,)
    topo, problems = build_topology(links, expected_kind="torus4x4", expected_connected=TRN2_LINKS)
    assert topo.kind == "torus4x4" and topo.source == "catalog"
    assert problems and "instance catalog says torus4x4" in problems[0]
    assert topo.neighbours[3] == (0, 2, 7, 15)


def test_catalog_kind_differs_from_links() -> None:
    chain = [tuple(n) for n in regular_neighbours("chain", 6)]
    topo, problems = build_topology(chain, expected_kind="ring")
    assert topo.kind == "ring" and "describe a chain" in problems[0]


def test_no_catalog_and_irregular_links() -> None:
    topo, problems = build_topology([(1,), (0, 2), (1,), ()])
    assert topo.kind == "none" and "not in the catalog" in problems[0]
    assert topo.group_sizes == (1,)


def test_masks_round_trip() -> None:
    assert members(mask_of([0, 5, 15])) == (0, 5, 15)
    assert members(0) == ()
