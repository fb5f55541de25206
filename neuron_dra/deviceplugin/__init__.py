"""The Neuron device plugin: ``aws.amazon.com/neuron`` (whole devices) and ``aws.amazon.com/neuroncore``.

Both registrations share one :class:`~neuron_dra.deviceplugin.node.NeuronNode` (inventory, health, IDs in use)
so the two resources never hand out the same chip. See docs/neuron-device-plugin.md.
"""

from neuron_dra.deviceplugin.node import NeuronNode
from neuron_dra.deviceplugin.policy import NeuronCorePolicy, NeuronDevicePolicy

__all__ = ["NeuronCorePolicy", "NeuronDevicePolicy", "NeuronNode"]
