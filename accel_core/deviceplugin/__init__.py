"""Generic kubelet device-plugin adapter: a policy says what to advertise and allocate; the server does the rest."""

from accel_core.deviceplugin.policy import AdvertisedDevice, AllocationError, DevicePluginPolicy
from accel_core.deviceplugin.server import DevicePluginServer

__all__ = ["AdvertisedDevice", "AllocationError", "DevicePluginPolicy", "DevicePluginServer"]
