"""The command lines of a rig control plane's components (etcd, kube-apiserver, kube-scheduler,
kube-controller-manager): addresses, certificates, authorization, admission and the controllers left out."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from accel_rig.controlplane_pki import SERVICE_CIDR, Pki

SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
#: Feature gates passed to all three kube components. None are needed with v1.37: DynamicResourceAllocation,
#: DRADeviceTaints, DRADeviceTaintRules, DRAPrioritizedList and ServiceAccountTokenNodeBinding/PodNodeInfo are
#: GA there (setting them only logs "setting GA feature gate"), and naming a removed gate is a start-up error.
DEFAULT_FEATURE_GATES: Mapping[str, bool] = {}
#: ``--runtime-config`` entries. v1.37 serves resource.k8s.io/v1 (deviceclasses, devicetaintrules,
#: resourceclaims, resourceclaimtemplates, resourceslices) and ValidatingAdmissionPolicy by default.
DEFAULT_RUNTIME_CONFIG: tuple[str, ...] = ()
#: Controllers left out of kube-controller-manager. Without a kubelet, node-lifecycle would mark every
#: fake Node NotReady and taint it, and the scheduler would then refuse it.
DISABLED_CONTROLLERS: tuple[str, ...] = ("node-lifecycle-controller",)


@dataclass(frozen=True)
class ComponentFlags:
    """Flags of each component of the control plane whose state lives in ``state_dir``; each method takes the ports
    picked for that component."""

    state_dir: Path
    verbosity: int = 0
    feature_gates: Mapping[str, bool] = field(default_factory=dict)
    etcd_fsync: bool = False

    @property
    def pki(self) -> Pki:
        return Pki(self.state_dir / "pki")

    def common(self) -> list[str]:
        flags = [f"--v={self.verbosity}"]
        if self.feature_gates:
            gates = ",".join(f"{k}={'true' if v else 'false'}" for k, v in sorted(self.feature_gates.items()))
            flags.append(f"--feature-gates={gates}")
        return flags

    def etcd(self, ports: tuple[int, ...]) -> list[str]:
        client, peer = (f"http://127.0.0.1:{p}" for p in ports)
        return [
            "--name=accel",
            f"--data-dir={self.state_dir / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=accel={peer}",
            "--log-level=warn",
            f"--unsafe-no-fsync={'false' if self.etcd_fsync else 'true'}",
        ]

    def apiserver(self, ports: tuple[int, ...], etcd_url: str) -> list[str]:
        pki = self.pki
        flags = [
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={ports[0]}",
            f"--cert-dir={self.state_dir / 'apiserver-certs'}",
            f"--tls-cert-file={pki.apiserver_cert}",
            f"--tls-private-key-file={pki.apiserver_key}",
            f"--client-ca-file={pki.ca_cert}",
            # kubectl logs/exec/port-forward and the service/pod proxy: the kubelet trusts the cluster CA's admin
            # certificate, and every connection to a node or pod goes through the egress proxy (loopback only).
            f"--kubelet-client-certificate={pki.client('admin')[0]}",
            f"--kubelet-client-key={pki.client('admin')[1]}",
            f"--egress-selector-config-file={self.state_dir / 'egress-selector.json'}",
            # The node's address first: node proxy checks it is a global unicast IP (a name would need DNS).
            "--kubelet-preferred-address-types=InternalIP,Hostname,InternalDNS,ExternalDNS,ExternalIP",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={pki.sa_pub}",
            f"--service-account-signing-key-file={pki.sa_key}",
            "--authorization-mode=Node,RBAC",
            # No front proxy; naming a request-header CA (with an identity no certificate has) only keeps
            # kube-scheduler/controller-manager from logging that the bundle is missing.
            f"--requestheader-client-ca-file={pki.ca_cert}",
            "--requestheader-allowed-names=accel-front-proxy-unused",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            "--enable-admission-plugins=NodeRestriction",
            "--allow-privileged=true",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            # Endpoints may not hold loopback addresses, so the "kubernetes" Service gets none.
            "--endpoint-reconciler-type=none",
            "--profiling=false",
            *self.common(),
        ]
        if DEFAULT_RUNTIME_CONFIG:
            flags.append(f"--runtime-config={','.join(DEFAULT_RUNTIME_CONFIG)}")
        return flags

    def _client_component(self, who: str, port: int) -> list[str]:
        kubeconfig = self.state_dir / f"{who}.kubeconfig"
        return [
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={self.state_dir / (who + '-certs')}",
            *self.common(),
        ]

    def scheduler(self, ports: tuple[int, ...]) -> list[str]:
        return self._client_component("scheduler", ports[0])

    def controller_manager(self, ports: tuple[int, ...]) -> list[str]:
        pki = self.pki
        return [
            *self._client_component("controller-manager", ports[0]),
            "--controllers=" + ",".join(["*", *(f"-{c}" for c in DISABLED_CONTROLLERS)]),
            "--use-service-account-credentials=true",
            f"--root-ca-file={pki.ca_cert}",
            f"--service-account-private-key-file={pki.sa_key}",
            f"--cluster-signing-cert-file={pki.ca_cert}",
            f"--cluster-signing-key-file={pki.ca_key}",
        ]
