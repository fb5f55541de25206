"""The Neuron DRA driver ``neuron.aws.com``: ResourceSlices with topology and EFA-proximity attributes, per-claim
CDI specs with Logical NeuronCore config, a checkpoint, health, and the ``neuron-dra-driver`` command."""
