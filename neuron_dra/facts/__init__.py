"""Neuron's facts, pure data and pure functions (no host reads, no Kubernetes):

- :mod:`~neuron_dra.facts.arch`: per Neuron architecture, NeuronCores, memory and device names, and the Neuron
  types the catalog does not describe device by device;
- :mod:`~neuron_dra.facts.catalog` and ``instances.yaml``: Neuron's catalog section (per instance type, the Neuron
  devices: PCI addresses, PCIe roots, NUMA nodes, links), declared in :mod:`neuron_dra.accelerator`;
- :mod:`~neuron_dra.facts.ultraserver`: UltraServer (trn2u) class attributes, node labels, modes and runtime env
  names, and the ids a fake UltraServer node reports.

Discovery, both Neuron daemons and the fake host (:mod:`neuron_dra.fakehost`) read them from here.
"""
