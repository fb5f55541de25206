"""Opaque configs checked when a ResourceClaim, ResourceClaimTemplate or DeviceClass is created: a validating
admission webhook that runs the driver profile's own decoder (``profile.decode_config``), so the API server refuses
what prepare would refuse, with the same line.

The API server sends an ``admission.k8s.io/v1`` AdmissionReview for a ``resource.k8s.io`` ResourceClaim
(``spec.devices.config[]``), ResourceClaimTemplate (``spec.spec.devices.config[]``) or DeviceClass
(``spec.config[]``, named ``FromClass`` as prepare names a class's configs), CREATE or UPDATE. Every
entry whose ``opaque.driver`` is this driver is decoded, applicable to a request or not (as prepare does); the
first that fails refuses the object with the decoder's message, its place written as prepare writes it:
``config[0] (FromClaim, requests neuron): logicalNeuronCore must be 1 or 2, got 3``. Anything else is allowed,
including configs of other drivers, which are theirs to check. A body that is no AdmissionReview is a 400 (the API
server then applies the webhook's failurePolicy).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from accel_core.dra.config import ConfigError
from accel_core.logs import kv

log = logging.getLogger(__name__)

REVIEW_API_VERSION = "admission.k8s.io/v1"
#: kind -> (path from the object to its config list, the config's source as prepare names it)
CONFIG_PATHS: Mapping[str, tuple[tuple[str, ...], str]] = {
    "ResourceClaim": (("spec", "devices", "config"), "FromClaim"),
    "ResourceClaimTemplate": (("spec", "spec", "devices", "config"), "FromClaim"),
    "DeviceClass": (("spec", "config"), "FromClass"),
}

Decode = Callable[[Any, str], object]


class BadReview(ValueError):
    """The body is not an AdmissionReview this webhook can answer (the message says why, in one line)."""


def refusal(obj: Any, kind: str, *, driver: str, decode: Decode) -> str | None:
    """The decoder's message for the first of ``driver``'s opaque configs in ``obj`` that does not decode, else
    None. ``kind`` is ResourceClaim, ResourceClaimTemplate or DeviceClass."""
    path, source = CONFIG_PATHS[kind]
    configs: Any = obj
    for key in path:
        configs = configs.get(key) if isinstance(configs, Mapping) else None
    for index, entry in enumerate(configs if isinstance(configs, list) else ()):
        opaque = entry.get("opaque") if isinstance(entry, Mapping) else None
        if not isinstance(opaque, Mapping) or opaque.get("driver") != driver:
            continue
        requests = [str(r) for r in entry.get("requests") or () if isinstance(r, str)]
        where = f"config[{index}] ({source}" + (f", requests {', '.join(requests)})" if requests else ")")
        try:
            decode(opaque.get("parameters"), where)
        except ConfigError as exc:
            return str(exc)
    return None


def review(body: bytes, *, driver: str, decode: Decode) -> dict[str, Any]:
    """The AdmissionReview answering ``body`` (BadReview when it is none)."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise BadReview(f"body is not JSON: {str(exc)[:100]}") from None
    request = doc.get("request") if isinstance(doc, dict) else None
    if not isinstance(doc, dict) or doc.get("kind") != "AdmissionReview" or not isinstance(request, dict):
        raise BadReview("body is not an AdmissionReview with a request")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise BadReview("the AdmissionReview request has no uid")
    group_kind = request.get("kind")
    kind = group_kind.get("kind") if isinstance(group_kind, dict) else None
    obj = request.get("object")
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    if (isinstance(kind, str) and kind in CONFIG_PATHS and isinstance(obj, dict)
            and request.get("operation") in ("CREATE", "UPDATE")):
        message = refusal(obj, kind, driver=driver, decode=decode)
        if message is not None:
            response = {"uid": uid, "allowed": False,
                        "status": {"code": 422, "reason": "Invalid", "message": message}}
            log.info("refused an opaque config", extra=kv(
                kind=kind, namespace=request.get("namespace") or "", name=_name(request, obj), error=message))
    return {"apiVersion": doc.get("apiVersion") or REVIEW_API_VERSION, "kind": "AdmissionReview",
            "response": response}


def _name(request: Mapping[str, Any], obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    name = request.get("name") or (meta.get("name") or meta.get("generateName") if isinstance(meta, Mapping) else "")
    return str(name or "")[:100]
