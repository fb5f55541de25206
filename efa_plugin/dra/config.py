"""The EFA DRA driver's opaque claim configuration as a msgspec Struct (decoded strictly by
:func:`accel_core.dra.config.decode_struct`)::

    parameters:
      apiVersion: efa.aws.com/v1
      kind: EfaConfig           # no settings yet: any other field is refused
"""

from __future__ import annotations

from typing import Literal, get_args

import msgspec

from efa_plugin import DRA_DRIVER_NAME

ApiVersion = Literal["efa.aws.com/v1"]
assert get_args(ApiVersion) == (f"{DRA_DRIVER_NAME}/v1",)


class EfaParams(msgspec.Struct, tag_field="kind", tag="EfaConfig", forbid_unknown_fields=True, frozen=True):
    """``EfaConfig`` parameters."""

    apiVersion: ApiVersion  # noqa: N815 (the API's field name)
