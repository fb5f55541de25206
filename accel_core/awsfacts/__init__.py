"""Facts about AWS hardware that no one accelerator owns, in one place that discovery, the drivers and the fake
host read:

- :mod:`~accel_core.awsfacts.catalog`: the instance catalog, merged by type from each registered accelerator's
  catalog sections and file (``instances.yaml`` here holds the types none of them describes);
- :mod:`~accel_core.awsfacts.neuron_efa`: the AWS Neuron-to-EFA tables and the ``devicegroup{1,4,8,16}_id``
  hashing that both DRA drivers publish and the EFA device plugin uses for Neuron proximity: one fact of two
  accelerators, which may not import each other.

An accelerator's own facts live in its package (``efa_plugin/facts.py``, ``neuron_dra/facts/``). Pure data and pure
functions: no host reads, no Kubernetes; nothing here imports the fake host or the dev tools.
"""
