"""What ``explain`` reads: the target (a pod's claims, one claim, or a template), DeviceClasses, ResourceSlices and
the claims holding devices, from the API server (read only: GET and LIST) or from files for offline use (``-f``
with the claim and, optionally, DeviceClasses and allocated claims; ``--slices`` with the output of ``slices``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from accel_core.dra.explain import ClaimSpec, DeviceId
from accel_core.nodeaffinity import selects_node

KINDS = {"pod": "Pod", "pods": "Pod", "po": "Pod", "resourceclaim": "ResourceClaim",
         "resourceclaims": "ResourceClaim", "claim": "ResourceClaim",
         "resourceclaimtemplate": "ResourceClaimTemplate", "resourceclaimtemplates": "ResourceClaimTemplate",
         "template": "ResourceClaimTemplate"}


class SourceError(Exception):
    """The target or an input cannot be read; the message names it."""


@dataclass
class Inputs:
    target: str
    claims: list[ClaimSpec] = field(default_factory=list)
    allocated_lines: list[str] = field(default_factory=list)
    classes: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    slices: Sequence[Mapping[str, Any]] = field(default_factory=list)
    allocated: dict[DeviceId, str] = field(default_factory=dict)
    nodes: set[str] | None = None  #: only these nodes can take the pod (its nodeName, nodeSelector, allocations)
    notes: list[str] = field(default_factory=list)


def parse_target(text: str) -> tuple[str, str]:
    kind, sep, name = text.partition("/")
    if not sep or not name or kind.lower() not in KINDS:
        raise SourceError(f"target {text!r}: expected pod/NAME, resourceclaim/NAME or resourceclaimtemplate/NAME")
    return KINDS[kind.lower()], name


def holders(claims: Iterable[Mapping[str, Any]]) -> dict[DeviceId, str]:
    """Device -> ``namespace/name`` of the claim whose allocation holds it (admin-access results hold nothing)."""
    out = {}
    for claim in claims:
        meta = claim.get("metadata") or {}
        results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
        for r in results:
            if not r.get("adminAccess"):
                out[(r["driver"], r["pool"], r["device"])] = f"{meta.get('namespace')}/{meta.get('name')}"
    return out


def allocation_node(claim: Mapping[str, Any]) -> str | None:
    """The node an allocated claim is bound to (its allocation's node selector on ``metadata.name``)."""
    selector = ((claim.get("status") or {}).get("allocation") or {}).get("nodeSelector") or {}
    for term in selector.get("nodeSelectorTerms") or []:
        for expr in (term.get("matchFields") or []) + (term.get("matchExpressions") or []):
            if expr.get("key") in ("metadata.name", "kubernetes.io/hostname") and expr.get("operator") == "In":
                return str(expr["values"][0])
    return None


def add_claim(inputs: Inputs, label: str, claim: Mapping[str, Any]) -> None:
    """A claim object: placed when unallocated, else reported (and its node limits where the pod can go)."""
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        inputs.claims.append(ClaimSpec(label, claim.get("spec") or {}))
        return
    node = allocation_node(claim)
    devices = [r["device"] for r in (allocation.get("devices") or {}).get("results") or []]
    inputs.allocated_lines.append(f"claim {label} is allocated: {', '.join(devices) or 'no devices'}"
                                  + (f" on node {node}" if node else " (not node-local)"))
    if node:
        inputs.nodes = {node} if inputs.nodes is None else inputs.nodes & {node}


def pod_claims(inputs: Inputs, pod: Mapping[str, Any], get_claim: Any, get_template: Any) -> None:
    """The pod's claims: named claims, and template claims (the generated claim once it exists)."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    generated = {s["name"]: s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or []}
    for entry in spec.get("resourceClaims") or []:
        name = entry["name"]
        if entry.get("resourceClaimName"):
            add_claim(inputs, f"{name} (resourceclaim {entry['resourceClaimName']})",
                      get_claim(entry["resourceClaimName"]))
        elif generated.get(name):
            add_claim(inputs, f"{name} (resourceclaim {generated[name]})", get_claim(generated[name]))
        elif entry.get("resourceClaimTemplateName"):
            template = get_template(entry["resourceClaimTemplateName"])
            inputs.claims.append(ClaimSpec(f"{name} (template {entry['resourceClaimTemplateName']})",
                                           (template.get("spec") or {}).get("spec") or {}))
    if spec.get("nodeName"):
        inputs.nodes = {spec["nodeName"]} if inputs.nodes is None else inputs.nodes & {spec["nodeName"]}


#: The name every DeviceClass answers to as an extended resource, besides its own ``extendedResourceName``.
IMPLICIT_EXTENDED = "deviceclass.resource.kubernetes.io/"


def extended_claim(inputs: Inputs, pod: Mapping[str, Any], get_claim: Any) -> set[str]:
    """A pod asking extended resources that DeviceClasses serve (DRAExtendedResource): the claim kube-scheduler
    makes for it (one request per container and resource, ExactCount, from the class), or the one it made.
    Returns the resource names (nodes whose device plugin advertises one are not DRA's to explain)."""
    by_name = {IMPLICIT_EXTENDED + name: name for name in inputs.classes}
    by_name.update({c["spec"]["extendedResourceName"]: name for name, c in inputs.classes.items()
                    if (c.get("spec") or {}).get("extendedResourceName")})
    requests: list[dict[str, Any]] = []
    names: set[str] = set()
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        asked = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
        for resource, quantity in sorted(asked.items()):
            if resource in by_name:
                names.add(resource)
                requests.append({"name": f"container-{container['name']}-{len(requests)}", "exactly": {
                    "deviceClassName": by_name[resource], "count": int(str(quantity))}})
    if not requests:
        return names
    made = ((pod.get("status") or {}).get("extendedResourceClaimStatus") or {}).get("resourceClaimName")
    label = f"extended resources ({', '.join(sorted(names))})"
    if made:
        add_claim(inputs, f"{label} (resourceclaim {made})", get_claim(made))
    else:
        inputs.claims.append(ClaimSpec(label, {"devices": {"requests": requests}}))
    return names


def plugin_nodes(inputs: Inputs, resources: set[str], nodes: Sequence[Mapping[str, Any]]) -> None:
    """Leave out nodes whose device plugin advertises one of ``resources``: the scheduler uses the plugin there."""
    served = {n["metadata"]["name"] for n in nodes
              if any(((n.get("status") or {}).get("allocatable") or {}).get(r, "0") not in ("0", 0) for r in resources)}
    if served:
        everywhere = {n["metadata"]["name"] for n in nodes}
        inputs.nodes = (everywhere if inputs.nodes is None else inputs.nodes) - served
        inputs.notes.append(f"{len(served)} node(s) serve {', '.join(sorted(resources))} through a device plugin: "
                            "not explained")


def select_nodes(inputs: Inputs, pod: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]]) -> None:
    """Apply the pod's nodeSelector (exact labels); affinity, resources and Node taints are not checked."""
    selector = (pod.get("spec") or {}).get("nodeSelector") or {}
    if not selector:
        return
    fitting = {n["metadata"]["name"] for n in nodes
               if selects_node({"nodeSelector": selector}, n["metadata"].get("labels") or {})}
    inputs.nodes = fitting if inputs.nodes is None else inputs.nodes & fitting
    inputs.notes.append(f"the pod's nodeSelector {selector} leaves {len(fitting)} node(s)")


# -- from the API server ---------------------------------------------------------------------------------------------
def from_api(client: Any, kind: str, name: str, namespace: str) -> Inputs:
    """Read everything with ``client`` (a lightkube Client)."""
    from lightkube import ApiError
    from lightkube.resources.core_v1 import Node, Pod
    from lightkube.resources.resource_v1 import DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice

    def get(resource: Any, obj_name: str, label: str) -> dict[str, Any]:
        try:
            data: dict[str, Any] = client.get(resource, obj_name, namespace=namespace).to_dict()
        except ApiError as exc:
            raise SourceError(f"{label} {namespace}/{obj_name}: {exc.status.message}") from None
        return data

    inputs = Inputs(target=f"{kind.lower()} {namespace}/{name}")
    get_claim = lambda n: get(ResourceClaim, n, "resourceclaim")  # noqa: E731
    get_template = lambda n: get(ResourceClaimTemplate, n, "resourceclaimtemplate")  # noqa: E731
    pod = None
    extended: set[str] = set()
    try:
        inputs.classes = {c.metadata.name: c.to_dict() for c in client.list(DeviceClass)}
        if kind == "Pod":
            pod = get(Pod, name, "pod")
            pod_claims(inputs, pod, get_claim, get_template)
            extended = extended_claim(inputs, pod, get_claim)
        elif kind == "ResourceClaim":
            add_claim(inputs, name, get_claim(name))
        else:
            inputs.claims.append(ClaimSpec(f"{name} (template)", (get_template(name).get("spec") or {}).get("spec")
                                           or {}))
        inputs.slices = [s.to_dict() for s in client.list(ResourceSlice)]
        try:
            inputs.allocated = holders(c.to_dict() for c in client.list(ResourceClaim, namespace="*"))
        except ApiError as exc:  # a user allowed only their own namespace still gets a verdict, with a caveat
            if exc.status.code != 403:
                raise
            inputs.allocated = holders(c.to_dict() for c in client.list(ResourceClaim, namespace=namespace))
            inputs.notes.append(f"claims outside {namespace} cannot be listed (forbidden): devices they hold count "
                                "as free here")
        if pod is not None and ((pod.get("spec") or {}).get("nodeSelector") or extended):
            try:
                nodes = [n.to_dict() for n in client.list(Node)]
            except ApiError as exc:
                if exc.status.code != 403:
                    raise
                inputs.notes.append("Nodes cannot be listed (forbidden): the pod's nodeSelector and device plugins "
                                    "are not checked")
                nodes = []
            if nodes:
                select_nodes(inputs, pod, nodes)
                plugin_nodes(inputs, extended, nodes)
    except ApiError as exc:
        raise SourceError(f"listing DeviceClasses, ResourceSlices, ResourceClaims or Nodes: {exc.status.message}") \
            from None
    return inputs


# -- from files ----------------------------------------------------------------------------------------------------
def load_objects(path: Path) -> list[dict[str, Any]]:
    """Every object in a JSON or YAML file: documents, lists (``kind: List``, ``slices`` output) flattened."""
    try:
        text = path.read_text()
        docs = [json.loads(text)] if text.lstrip().startswith(("[", "{")) else list(yaml.safe_load_all(text))
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise SourceError(f"{path}: {str(exc).splitlines()[0]}") from None
    out: list[dict[str, Any]] = []
    for doc in docs:
        items = doc if isinstance(doc, list) else (doc.get("items") if isinstance(doc, dict) and "items" in doc
                                                   else [doc])
        out += [d for d in items or [] if isinstance(d, dict) and d.get("kind")]
    return out


def from_files(files: Sequence[Path], slice_files: Sequence[Path], target: tuple[str, str] | None) -> Inputs:
    objects = [o for f in files for o in load_objects(f)]
    slices = [o for f in slice_files for o in load_objects(f) if o.get("kind") == "ResourceSlice"]
    slices += [o for o in objects if o.get("kind") == "ResourceSlice"]
    candidates = [o for o in objects if o.get("kind") in ("Pod", "ResourceClaim", "ResourceClaimTemplate")]
    if target is not None:
        candidates = [o for o in candidates if o["kind"] == target[0] and o["metadata"].get("name") == target[1]]
    if not candidates:
        wanted = f"{target[0]} {target[1]}" if target else "a Pod, ResourceClaim or ResourceClaimTemplate"
        raise SourceError(f"{', '.join(map(str, files)) or 'no -f file'}: no {wanted}")
    obj = candidates[0]
    name = obj["metadata"].get("name", "")
    inputs = Inputs(target=f"{obj['kind'].lower()} {name} (offline)", slices=slices)
    by_kind: dict[str, dict[str, dict[str, Any]]] = {}
    for o in objects:
        by_kind.setdefault(o["kind"], {})[o["metadata"].get("name", "")] = o

    def lookup(kind: str) -> Any:
        def get(obj_name: str) -> dict[str, Any]:
            if obj_name not in by_kind.get(kind, {}):
                raise SourceError(f"{kind} {obj_name} is not in the -f files")
            return by_kind[kind][obj_name]
        return get

    inputs.classes = dict(by_kind.get("DeviceClass", {}))
    if obj["kind"] == "Pod":
        pod_claims(inputs, obj, lookup("ResourceClaim"), lookup("ResourceClaimTemplate"))
        extended_claim(inputs, obj, lookup("ResourceClaim"))
    elif obj["kind"] == "ResourceClaim":
        add_claim(inputs, name, obj)
    else:
        inputs.claims.append(ClaimSpec(f"{name} (template)", (obj.get("spec") or {}).get("spec") or {}))
    inputs.allocated = holders(by_kind.get("ResourceClaim", {}).values())
    for claim in inputs.claims:
        for req in (claim.spec.get("devices") or {}).get("requests") or []:
            for body in req.get("firstAvailable") or [req.get("exactly") or {}]:
                cls = body.get("deviceClassName")
                if cls and cls not in inputs.classes:
                    inputs.classes[cls] = {"metadata": {"name": cls}, "spec": {}}
                    inputs.notes.append(f"DeviceClass {cls} is not in the -f files: taken as selecting every device")
    return inputs
