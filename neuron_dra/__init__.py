"""AWS Neuron on Kubernetes: host discovery and topology (shared), the Neuron device plugin and the DRA driver.

- :mod:`neuron_dra.discovery` reads ``/sys/class/neuron_device``, ``/dev/neuronN``, DMI and the LNC file into a
  frozen :class:`~neuron_dra.discovery.NeuronInventory`;
- :mod:`neuron_dra.topology` turns ``connected_devices`` into a ring, chain or 4x4 torus with connected groups;
- :mod:`neuron_dra.deviceplugin` serves ``aws.amazon.com/neuron`` and ``aws.amazon.com/neuroncore``.
"""

#: The Neuron DRA driver (neuron_dra.dra); it and the device plugin step aside for each other on a node.
DRA_DRIVER_NAME = "neuron.aws.com"

__all__ = ["DRA_DRIVER_NAME"]
