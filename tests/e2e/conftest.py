"""The e2e fixtures are in tests/kube_fixtures.py (loaded for every test directory by tests/conftest.py); the test
modules here import ``RealNode``, ``Daemon``, ``REPO_ROOT`` and ``console_script`` from ``conftest``, which is this
module. The ``helm`` fixture serves the tests that render the charts (tests/e2e/gotools)."""

from __future__ import annotations

from pathlib import Path

import pytest
from chart_render import find_or_build_helm
from kube_fixtures import REPO_ROOT, Daemon, RealNode, console_script

__all__ = ["REPO_ROOT", "Daemon", "RealNode", "console_script"]


@pytest.fixture(scope="session")
def helm() -> Path:
    """The helm binary scripts/build-kube.sh caches (only helm is built, from Go, when it is missing)."""
    return find_or_build_helm()
