"""What ``neuron-dra-driver explain`` adds to the core's reasons: the sizes of connected Neuron device sets, shown
when a ``matchAttribute`` constraint on a connected-group attribute finds no set big enough."""

from __future__ import annotations

from accel_core.awsfacts.neuron_efa import GROUP_SIZES, attribute_name
from accel_core.dra.explain import ExplainHints
from neuron_dra import DRA_DRIVER_NAME

_SIZES = ", ".join(map(str, GROUP_SIZES[:-1])) + f" and {GROUP_SIZES[-1]}"
CONNECTED = (f"Connected Neuron device sets come in sizes {_SIZES} (resource.aws.com/devicegroup{{"
             + ",".join(map(str, GROUP_SIZES)) + "}_id; topology4_id and topology8_id on the 4x4 torus): ask for "
             "one of these counts with its attribute, or a firstAvailable list of them")

NEURON_EXPLAIN_HINTS = ExplainHints(attribute_notes={
    **{attribute_name(size): CONNECTED for size in GROUP_SIZES},
    **{f"{DRA_DRIVER_NAME}/topology{size}_id": CONNECTED for size in (4, 8)},
})
