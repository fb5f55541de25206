"""The EFA DRA driver ``efa.aws.com``: a profile of the generic DRA core (:mod:`accel_core.dra`) and the
``efa-dra-driver`` command. See docs/efa-dra-driver.md."""
