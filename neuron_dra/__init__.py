"""AWS Neuron on Kubernetes: host discovery and topology (shared), the Neuron device plugin and the DRA driver.

- :mod:`neuron_dra.discovery` reads ``/sys/class/neuron_device``, ``/dev/neuronN``, DMI and the LNC file into a
  frozen :class:`~neuron_dra.discovery.NeuronInventory`;
- :mod:`neuron_dra.topology` turns ``connected_devices`` into a ring, chain or 4x4 torus with connected groups;
- :mod:`neuron_dra.deviceplugin` serves ``aws.amazon.com/neuron`` and ``aws.amazon.com/neuroncore``.
"""

from accel_core.coexistence import Coexistence

#: The Neuron DRA driver (neuron_dra.dra); it and the device plugin share a node: the DRA driver wins.
DRA_DRIVER_NAME = "neuron.aws.com"
#: The device plugin's two sockets, as the AWS Neuron device plugin names them.
NEURON_SOCKET = "neuron-devplugin.sock"
NEURONCORE_SOCKET = "neuroncore-devplugin.sock"
#: The device plugin's two extended resources.
NEURON_RESOURCE = "aws.amazon.com/neuron"
NEURONCORE_RESOURCE = "aws.amazon.com/neuroncore"
#: The DRA driver's chip devices are ``neuron-device-<index>``.
DEVICE_PREFIX = "neuron-device-"
#: The one coexistence rule of the two (accel_core.coexistence), light enough for the device plugin's first Register.
COEXISTENCE = Coexistence("Neuron", (NEURON_SOCKET, NEURONCORE_SOCKET), DRA_DRIVER_NAME,
                          (NEURON_RESOURCE, NEURONCORE_RESOURCE))

__all__ = ["COEXISTENCE", "DEVICE_PREFIX", "DRA_DRIVER_NAME", "NEURONCORE_RESOURCE", "NEURONCORE_SOCKET",
           "NEURON_RESOURCE", "NEURON_SOCKET"]
