"""Generic kubelet device-plugin adapter: a policy says what to advertise and allocate; the server does the rest."""

from accel_core.deviceplugin.pluginserver import DevicePluginServer
from accel_core.deviceplugin.policy import AdvertisedDevice, AllocationError, DevicePluginPolicy

__all__ = ["AdvertisedDevice", "AllocationError", "DevicePluginPolicy", "DevicePluginServer"]
