"""Kubelet plugin API string constants that the generated code does not carry."""

from typing import Final

#: Device plugin API version sent in ``RegisterRequest.version``.
DEVICE_PLUGIN_VERSION: Final = "v1beta1"

#: ``Device.health`` values understood by the kubelet; anything else counts as unhealthy.
HEALTHY: Final = "Healthy"
UNHEALTHY: Final = "Unhealthy"

#: ``PluginInfo.type`` values for the plugins_registry watcher.
PLUGIN_TYPE_DRA: Final = "DRAPlugin"
PLUGIN_TYPE_DEVICE_PLUGIN: Final = "DevicePlugin"

#: ``PluginInfo.supported_versions`` entries: "<last proto package segment>.<Service>".
DRA_V1_SERVICE: Final = "v1.DRAPlugin"
DRA_V1BETA1_SERVICE: Final = "v1beta1.DRAPlugin"
DRA_HEALTH_V1ALPHA1_SERVICE: Final = "v1alpha1.DRAResourceHealth"
