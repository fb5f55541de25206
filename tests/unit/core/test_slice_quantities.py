"""Issue 24 item 4: slice capacities and the published-spec comparison read quantities with lightkube's parser.
The values expected come from the Kubernetes quantity format (binary suffixes are powers of 2, decimal ones powers of
10, no spaces, ASCII digits)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from accel_core.dra.slicemodel import SliceDevice, SliceValidationError, quantity_value, validate_devices


@pytest.mark.parametrize(("text", "value"), [
    ("96Gi", 96 * 2**30), ("1.5", Decimal("1.5")), ("100m", Decimal("0.1")), ("1e3", 1000), ("2k", 2000),
    (".5Ki", 512), ("1.", 1), ("5E", 5 * 10**18),
])
def test_kubernetes_quantities(text: str, value: Decimal | int) -> None:
    assert quantity_value(text) == value


@pytest.mark.parametrize("amount", ["1Gi ", " 1Gi", "1 Gi", "\u0663Gi", "1GB", "lots"])
def test_capacities_the_api_server_would_refuse_are_refused_here_naming_the_device(amount: str) -> None:
    # a space or a non-ASCII digit used to pass (stripped, or read by Decimal) and failed only at the API server
    with pytest.raises(SliceValidationError, match=r"device dev-0: capacity 'memory': .* is not a non-negative"):
        validate_devices([SliceDevice("dev-0", {"a": 1}, {"memory": amount})])
