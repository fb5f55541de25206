"""Facts about AWS hardware, in one place that discovery, the drivers and the fake host all read.

- :mod:`~accel_core.awsfacts.catalog` and ``instances.yaml``: per instance type, the EFA, GPU and Neuron devices
  (PCI addresses, PCIe roots, NUMA nodes, Neuron links);
- :mod:`~accel_core.awsfacts.neuron_efa`: the AWS Neuron-to-EFA tables and the ``devicegroup{1,4,8,16}_id``
  hashing that both DRA drivers publish and the EFA device plugin uses for Neuron proximity;
- :mod:`~accel_core.awsfacts.neuron`: per Neuron architecture, NeuronCores, memory and device names.
- :mod:`~accel_core.awsfacts.ultraserver`: UltraServer (trn2u) class attributes, node labels, modes and runtime env
  names, and the ids a fake UltraServer node reports.

Pure data and pure functions: no host reads, no Kubernetes. The fake host builds trees from these facts, and
production code reads them as fallbacks and lookup tables; nothing here imports the fake host or the dev tools.
"""
