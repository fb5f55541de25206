"""The Neuron device plugin: ``aws.amazon.com/neuron`` (whole devices) and ``aws.amazon.com/neuroncore``.

Both registrations share one :class:`~neuron_dra.deviceplugin.node.NeuronNode` (inventory, health, IDs in use)
so the two resources never hand out the same chip. See docs/neuron-device-plugin.md.

The names below load on first use, so ``neuron-device-plugin serve`` can register before the scan and the
policies are loaded.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from neuron_dra.deviceplugin.node import NeuronNode
    from neuron_dra.deviceplugin.policy import NeuronCorePolicy, NeuronDevicePolicy

__all__ = ["NeuronCorePolicy", "NeuronDevicePolicy", "NeuronNode"]

_HOMES = {"NeuronNode": "node", "NeuronCorePolicy": "policy", "NeuronDevicePolicy": "policy"}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{home}"), name)
