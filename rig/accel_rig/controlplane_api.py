"""Typed access to a rig's API server as the admin user (:class:`AdminApi`) and the admin's chores: minting a
service-account token, making a kubelet-less Node the scheduler accepts."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx2
from lightkube import ApiError, Client, KubeConfig
from lightkube.config.models import Cluster, User
from lightkube.models.authentication_v1 import BoundObjectReference, TokenRequestSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node, NodeStatus, Pod, ServiceAccountToken
from lightkube.types import PatchType

from accel_rig.controlplane_errors import ApiRequestError, ControlPlaneError
from accel_rig.controlplane_pki import Pki


@dataclass(frozen=True)
class AdminApi:
    """A lightkube client for a running API server (``https://127.0.0.1:PORT``) with the admin client certificate.

    Objects are typed lightkube models, so a misspelt field fails before it is sent. API errors and transport
    failures come out as :class:`ApiRequestError` / :class:`ControlPlaneError` naming the call (see ``errors``).
    """

    server: str
    pki: Pki
    timeout: float = 15.0

    def client(self) -> Client:
        cert, key = self.pki.client("admin")
        config = KubeConfig.from_one(
            cluster=Cluster(server=self.server, certificate_auth=str(self.pki.ca_cert)),
            user=User(client_cert=str(cert), client_key=str(key)),
            namespace="default",
        )
        # trust_env=False: a proxy from the environment must not sit between the tool and 127.0.0.1
        return Client(config=config, timeout=httpx2.Timeout(self.timeout), trust_env=False)

    @staticmethod
    @contextlib.contextmanager
    def errors(what: str) -> Iterator[None]:
        """Turn lightkube/httpx failures of ``what`` into ControlPlaneError (ApiRequestError for an HTTP status)."""
        try:
            yield
        except ApiError as e:
            code = e.status.code or (e.response.status_code if e.response is not None else 0)
            raise ApiRequestError(code, f"{what} -> HTTP {code}: {e.status.message}") from e
        except (OSError, httpx2.HTTPError) as e:
            raise ControlPlaneError(f"{what} failed: {e}") from e


def mint_token(
    api: AdminApi,
    namespace: str,
    service_account: str,
    audiences: Sequence[str] | None = None,
    *,
    bound_pod: str | None = None,
    bound_node: str | None = None,
    expiration_seconds: int = 3600,
) -> str:
    """A service-account token from the TokenRequest API.

    ``bound_node`` binds it to that Node and ``bound_pod`` to that Pod in ``namespace``; both put the
    ``authentication.kubernetes.io/node-name`` claim in the token (for a Pod, once it is scheduled).
    ``audiences=None`` means the API server's own audience. Expiry is at least 600 s (API rule).
    """
    if bound_pod and bound_node:
        raise ValueError("bind the token to a Pod or to a Node, not both")
    spec = TokenRequestSpec(expirationSeconds=expiration_seconds, audiences=list(audiences) if audiences else None)
    client = api.client()
    try:
        if bound_pod:
            with api.errors(f"GET pod {namespace}/{bound_pod}"):
                pod = client.get(Pod, bound_pod, namespace=namespace)
            spec.boundObjectRef = BoundObjectReference(kind="Pod", apiVersion="v1", name=bound_pod,
                                                       uid=pod.metadata.uid if pod.metadata else None)
        if bound_node:
            with api.errors(f"GET node {bound_node}"):
                node = client.get(Node, bound_node)
            spec.boundObjectRef = BoundObjectReference(kind="Node", apiVersion="v1", name=bound_node,
                                                       uid=node.metadata.uid if node.metadata else None)
        with api.errors(f"TokenRequest for {namespace}/{service_account}"):
            result = client.create(ServiceAccountToken(metadata=ObjectMeta(), spec=spec), service_account,
                                   namespace=namespace)
    finally:
        client.close()
    token = result.status.token if result.status else None
    if not isinstance(token, str) or not token:
        raise ControlPlaneError(f"TokenRequest for {namespace}/{service_account} returned no token")
    return token


def create_fake_node(
    api: AdminApi,
    name: str,
    *,
    cpu: str = "8",
    memory: str = "32Gi",
    pods: str = "110",
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Create a Node the scheduler accepts although no kubelet runs behind it; return the Node.

    It gets capacity/allocatable for cpu, memory and pods and a Ready condition (status subresource),
    and loses the ``node.kubernetes.io/not-ready`` taint that admission puts on every new Node (the
    node-lifecycle controller, which would lift it, is off). Nothing renews it, so it stays as made.
    """
    node_labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", **(labels or {})}
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    resources = {"cpu": cpu, "memory": memory, "pods": pods}
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "fake node (no kubelet)",
             "lastHeartbeatTime": now, "lastTransitionTime": now}
    status = {"capacity": resources, "allocatable": resources, "conditions": [ready]}
    client = api.client()
    try:
        with api.errors(f"create node {name}"):
            client.create(Node(metadata=ObjectMeta(name=name, labels=node_labels)))
        with api.errors(f"patch node {name} status"):
            client.patch(NodeStatus, name, {"status": status}, patch_type=PatchType.MERGE)
        with api.errors(f"patch node {name}"):
            node = client.patch(Node, name, {"spec": {"taints": None}}, patch_type=PatchType.MERGE)
    finally:
        client.close()
    return node.to_dict()
