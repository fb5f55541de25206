"""Kubelet plugin gRPC APIs: generated protobuf/gRPC modules plus a few constants.

The ``*_pb2`` / ``*_pb2_grpc`` modules are generated from ``protos/`` by
``scripts/gen_protos.py``; do not edit them by hand. Modules, by API:

- device plugin v1beta1: ``deviceplugin_v1beta1_pb2``, ``deviceplugin_v1beta1_pb2_grpc``
- plugin registration: ``pluginregistration_v1_pb2``, ``pluginregistration_v1_pb2_grpc``
- DRA v1 / v1beta1: ``dra_v1_pb2``, ``dra_v1_pb2_grpc``, ``dra_v1beta1_pb2``, ``dra_v1beta1_pb2_grpc``
- DRA health v1alpha1: ``dra_health_v1alpha1_pb2``, ``dra_health_v1alpha1_pb2_grpc``
- pod resources v1: ``podresources_v1_pb2``, ``podresources_v1_pb2_grpc``
"""

import importlib
from types import ModuleType

from .constants import (
    DEVICE_PLUGIN_VERSION,
    DRA_HEALTH_V1ALPHA1_SERVICE,
    DRA_V1_SERVICE,
    DRA_V1BETA1_SERVICE,
    HEALTHY,
    PLUGIN_TYPE_DEVICE_PLUGIN,
    PLUGIN_TYPE_DRA,
    UNHEALTHY,
)

__all__ = [
    "DEVICE_PLUGIN_VERSION",
    "DRA_HEALTH_V1ALPHA1_SERVICE",
    "DRA_V1BETA1_SERVICE",
    "DRA_V1_SERVICE",
    "HEALTHY",
    "PLUGIN_TYPE_DEVICE_PLUGIN",
    "PLUGIN_TYPE_DRA",
    "UNHEALTHY",
    "deviceplugin_v1beta1_pb2",
    "deviceplugin_v1beta1_pb2_grpc",
    "dra_health_v1alpha1_pb2",
    "dra_health_v1alpha1_pb2_grpc",
    "dra_v1_pb2",
    "dra_v1_pb2_grpc",
    "dra_v1beta1_pb2",
    "dra_v1beta1_pb2_grpc",
    "pluginregistration_v1_pb2",
    "pluginregistration_v1_pb2_grpc",
    "podresources_v1_pb2",
    "podresources_v1_pb2_grpc",
]

_MODULES = frozenset(name for name in __all__ if name.endswith(("_pb2", "_pb2_grpc")))


def __getattr__(name: str) -> ModuleType:
    """Generated modules load on first use (a daemon imports only the APIs it speaks: faster start, less memory)."""
    if name in _MODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
