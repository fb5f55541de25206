"""Where a rig node keeps its files (:class:`NodeLayout`), the environment that points a daemon at them, and the
node's record ``node.json`` (:class:`NodeRecord`) that ``accel-cluster`` reads to find a running node again."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from accel_core.atomic import atomic_write_text
from accel_rig.containerdnode import FAKE_HOST_IN_NODE
from accel_rig.controlplane_errors import ControlPlaneError
from accel_rig.controlplane_processes import ProcessRecord

KUBELET = "kubelet"
FAKECRI = "fakecri"
CONTAINERD = "containerd"
NODE_RECORD = "node.json"


@dataclass(frozen=True)
class NodeLayout:
    """Where one node's files live; everything is under ``dir``. A containerd node's kubelet uses the usual
    ``/var/lib/kubelet`` inside its namespace (``<node>/var-lib/kubelet`` outside) and containerd reads CDI specs
    from ``/var/run/cdi`` (``<node>/run/cdi``), so the charts' default host paths are right on it."""

    dir: Path
    runtime: str = FAKECRI

    @property
    def host_root(self) -> Path:
        """The fake-sysfs tree of the node's instance type."""
        return self.dir / "host"

    @property
    def kubelet_root(self) -> Path:
        """The kubelet's ``--root-dir`` as seen from outside its mount namespace (with fakecri the same path
        inside and outside)."""
        return self.var_lib / "kubelet" if self.runtime == CONTAINERD else self.dir / "kubelet"

    @property
    def var_lib(self) -> Path:
        """Mounted over ``/var/lib`` for the kubelet."""
        return self.dir / "var-lib"

    @property
    def device_plugins_dir(self) -> Path:
        """``/var/lib/kubelet/device-plugins`` as the kubelet sees it."""
        return self.var_lib / "kubelet" / "device-plugins"

    @property
    def var_log(self) -> Path:
        return self.dir / "var-log"

    @property
    def cdi_root(self) -> Path:
        return self.dir / "run" / "cdi" if self.runtime == CONTAINERD else self.dir / "cdi"

    @property
    def pod_logs(self) -> Path:
        """``/var/log/pods`` of the node."""
        return self.var_log / "pods"

    @property
    def proc_sys(self) -> Path:
        return self.dir / "proc-sys"

    @property
    def cri_socket(self) -> Path:
        return self.dir / "cri.sock"

    @property
    def cri_record(self) -> Path:
        """JSON lines written by fakecri, one per recorded CRI call."""
        return self.dir / "cri.jsonl"

    @property
    def pki_dir(self) -> Path:
        return self.dir / "pki"

    @property
    def kubeconfig(self) -> Path:
        """The kubelet's own kubeconfig (``system:node:<name>``)."""
        return self.dir / "kubelet.kubeconfig"

    @property
    def config(self) -> Path:
        return self.dir / "kubelet-config.yaml"

    @property
    def log_dir(self) -> Path:
        return self.dir / "logs"

    @property
    def fake_host_path(self) -> str:
        """The fake host tree where the node's pods find it (``fakeHost.path`` of the charts): the same fixed path
        on every containerd node (its own mount namespace), the tree itself with fakecri."""
        return FAKE_HOST_IN_NODE if self.runtime == CONTAINERD else str(self.host_root)

    def node_env(self, node_name: str, kubeconfig: Path) -> dict[str, str]:
        """What ``accel-cluster node-env`` prints: :meth:`daemon_env`, except that a containerd node's
        ``HOST_ROOT`` is :attr:`fake_host_path` (what its pods and the charts use) and ``FAKE_HOST_DIR`` is the
        tree as the machine sees it (where faults are injected)."""
        env = self.daemon_env(node_name, kubeconfig)
        if self.runtime == CONTAINERD:
            env["HOST_ROOT"] = self.fake_host_path
            env["FAKE_HOST_DIR"] = str(self.host_root)
        return env

    def daemon_env(self, node_name: str, kubeconfig: Path) -> dict[str, str]:
        """The environment that points a daemon (``efa-device-plugin serve`` ...) at this node."""
        return {
            "NODE_NAME": node_name,
            "HOST_ROOT": str(self.host_root),
            "KUBELET_ROOT": str(self.kubelet_root),
            "DEVICE_PLUGINS_DIR": str(self.device_plugins_dir),
            "KUBELET_REGISTRAR_DIRECTORY_PATH": str(self.kubelet_root / "plugins_registry"),
            "KUBELET_PLUGINS_DIRECTORY_PATH": str(self.kubelet_root / "plugins"),
            "CDI_ROOT": str(self.cdi_root),
            "KUBECONFIG": str(kubeconfig),
        }


@dataclass(frozen=True)
class NodeRecord:
    """``<node>/node.json``: what ``accel-cluster`` needs to find a running node again."""

    name: str
    instance_type: str
    processes: tuple[ProcessRecord, ...] = ()
    ports: tuple[int, ...] = ()
    host_options: dict[str, Any] = field(default_factory=dict)
    """The fake host's build options (the accelerators' parts' flags, ``accel-cluster up``), to build it again."""
    runtime: str = FAKECRI
    #: A containerd node's machine-loopback address (127.0.0.N), where its kubelet port is served.
    loopback: str = ""

    def save(self, node_dir: Path) -> None:
        atomic_write_text(node_dir / NODE_RECORD, json.dumps(asdict(self), indent=2) + "\n", mode=0o644, durable=False)

    @classmethod
    def load(cls, node_dir: Path) -> NodeRecord | None:
        path = node_dir / NODE_RECORD
        try:
            raw = json.loads(path.read_text())
            return cls(
                name=str(raw["name"]),
                instance_type=str(raw["instance_type"]),
                processes=tuple(ProcessRecord.from_json(p) for p in raw.get("processes", [])),
                ports=tuple(int(x) for x in raw.get("ports", [])),
                host_options=dict(raw.get("host_options") or {}),
                runtime=str(raw.get("runtime", FAKECRI)),
                loopback=str(raw.get("loopback", "")),
            )
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ControlPlaneError(f"{path} is damaged ({e!r}); remove the node directory and start again") from e

