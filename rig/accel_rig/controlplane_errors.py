"""Errors of the loopback control plane and its tools (``controlplane``, ``accel-cluster``, the node tools)."""

from __future__ import annotations


class ControlPlaneError(RuntimeError):
    """The control plane could not be started, queried or stopped; the message says why."""


class MissingBinariesError(ControlPlaneError):
    """A needed binary is not in the binaries directory."""


class ApiRequestError(ControlPlaneError):
    """The API server answered a request with an error status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status

