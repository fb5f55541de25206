"""``catalog.get`` parses only the asked type's block of instances.yaml (daemon start-up); it must give exactly
what the whole-file parse gives, for every type, and the same error for an unknown one."""

from __future__ import annotations

import pytest

from accel_core.awsfacts import catalog


@pytest.fixture()
def fresh() -> None:
    catalog._one.cache_clear()
    catalog._default_catalog.cache_clear()


def test_every_type_parsed_alone_equals_the_whole_file(fresh: None) -> None:
    whole = catalog.load()
    assert len(whole) >= 15  # the 15 types the project supports (README)
    for name, itype in whole.items():
        assert catalog._one(name) == itype, name


def test_get_parses_one_block_until_the_catalog_is_loaded(fresh: None) -> None:
    trn2 = catalog.get("trn2.48xlarge")
    assert catalog._default_catalog.cache_info().currsize == 0, "get() alone must not parse the whole file"
    assert trn2.neuron_count == 16  # trn2.48xlarge: 16 Trainium2 devices (neuron.md)
    assert catalog.names()[0] == "p4d.24xlarge"  # names() loads the whole catalog
    assert catalog.get("trn2.48xlarge") == trn2


def test_unknown_type_names_the_known_ones(fresh: None) -> None:
    with pytest.raises(KeyError) as err:
        catalog.get("x9.huge")
    assert "x9.huge" in str(err.value) and "trn2.48xlarge" in str(err.value)
