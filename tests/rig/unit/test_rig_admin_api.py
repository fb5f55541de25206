"""The control-plane tool's admin API access reports failures as its own errors, naming the call."""

from __future__ import annotations

import httpx2
import pytest
from accel_rig.controlplane_api import AdminApi
from accel_rig.controlplane_errors import ApiRequestError, ControlPlaneError
from lightkube import ApiError
from lightkube.models.meta_v1 import Status


def test_an_api_status_becomes_api_request_error_with_the_code() -> None:
    with pytest.raises(ApiRequestError, match=r"^GET node n1 -> HTTP 404: nodes \"n1\" not found$") as err, \
            AdminApi.errors("GET node n1"):
        raise ApiError(status=Status(code=404, message='nodes "n1" not found'))
    assert err.value.status == 404


def test_a_transport_failure_becomes_control_plane_error() -> None:
    with pytest.raises(ControlPlaneError, match=r"^create node n1 failed: connection refused$") as err, \
            AdminApi.errors("create node n1"):
        raise httpx2.ConnectError("connection refused")
    assert not isinstance(err.value, ApiRequestError)
