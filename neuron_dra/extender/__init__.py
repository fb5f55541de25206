"""``neuron-scheduler-extender``: a kube-scheduler HTTP extender that places ``aws.amazon.com/neuron`` and
``aws.amazon.com/neuroncore`` pods only where a connected set is free, from the usage the device plugins publish on
their Nodes and the device plugin's own allocation policy."""
