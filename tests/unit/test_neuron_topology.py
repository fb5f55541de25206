"""Topology derivation, torus coordinates and groups, ring/chain runs, catalog cross-check."""

from __future__ import annotations

import pytest

from neuron_dra.topology import (
    Topology,
    TopologyError,
    build_topology,
    classify,
    mask_of,
    members,
    regular_neighbours,
)

# trn2.48xlarge connected_devices in driver order (neuron.md section 3)
TRN2_LINKS: list[tuple[int, ...]] = [
    (12, 1, 3, 4), (0, 13, 5, 2), (14, 3, 1, 6), (2, 15, 7, 0), (8, 5, 7, 0), (4, 9, 1, 6), (10, 7, 5, 2),
    (6, 11, 3, 4), (4, 9, 11, 12), (8, 5, 13, 10), (6, 11, 9, 14), (10, 7, 15, 8), (0, 13, 15, 8), (12, 1, 9, 14),
    (2, 15, 13, 10), (14, 3, 11, 12)]


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


def test_candidate_sets_on_the_torus() -> None:
    topo = Topology.regular("torus4x4", 16)
    pairs = {members(m) for m in topo.candidate_masks(2)}
    assert (0, 1) in pairs and (0, 3) in pairs and (0, 4) not in pairs  # within one row, wrap included
    assert len(pairs) == 16
    assert {members(m) for m in topo.candidate_masks(4)} == set(topo.connected_groups(4))
    sixes = [members(m) for m in topo.candidate_masks(6)]
    assert all(max(s) < 8 or min(s) >= 8 for s in sixes) and all(topo.is_connected(s) for s in sixes)
    assert topo.is_preferred_set([4, 5, 6, 7]) and not topo.is_preferred_set([2, 3, 4, 5])
    assert topo.is_preferred_set([9]) and not topo.is_preferred_set([0, 5])


def test_is_connected() -> None:
    topo = Topology.regular("torus4x4", 16)
    assert topo.is_connected([0, 1, 5]) and not topo.is_connected([0, 5])
    assert topo.is_connected([0, 12])  # vertical wrap


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
