"""Kubernetes name rules for what the kubelet (or anything that can reach the DRA socket) hands the driver.

Checked before a name is used at all: before an API request (a ``../`` in a namespace would otherwise walk the
request path to other objects), before anything is recorded in the checkpoint, and before it becomes part of a
CDI spec file or device name. Errors are short and show the value cut to 64 characters.

- namespace: a DNS-1123 label (at most 63 characters of ``[a-z0-9-]``, alphanumeric at both ends);
- claim name: a DNS-1123 subdomain (at most 253 characters, dot-separated labels);
- claim UID: the API server makes UUIDs; accepted is 1 to 128 characters of letters, digits, ``-``, ``_`` and
  ``.``, starting with a letter or digit: every UUID, and nothing that is unsafe in a file or CDI device name;
- request names in an allocation: a DNS label, or ``<request>/<subrequest>`` of two labels;
- device names: a DNS label (the ResourceSlice rule).
"""

from __future__ import annotations

import re

from accel_core.dra.types import ClaimError, ClaimRef

_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_UID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
SHOW = 64


def shown(value: object) -> str:
    """``repr`` of a value cut to a readable length."""
    text = value if isinstance(value, str) else str(value)
    return repr(text if len(text) <= SHOW else text[:SHOW] + "...")


def is_label(value: object) -> bool:
    return isinstance(value, str) and len(value) <= 63 and _LABEL.fullmatch(value) is not None


def is_subdomain(value: object) -> bool:
    return isinstance(value, str) and len(value) <= 253 and _SUBDOMAIN.fullmatch(value) is not None


def is_uid(value: object) -> bool:
    return isinstance(value, str) and _UID.fullmatch(value) is not None


def is_request_name(value: object) -> bool:
    if not isinstance(value, str):
        return False
    parts = value.split("/")
    return 1 <= len(parts) <= 2 and all(is_label(p) for p in parts)


def object_name_problem(namespace: str, name: str) -> str | None:
    """Why ``namespace``/``name`` cannot name a namespaced object, or None when it can."""
    if not is_label(namespace):
        return f"namespace {shown(namespace)} is not a DNS-1123 label"
    if not is_subdomain(name):
        return f"claim name {shown(name)} is not a DNS-1123 subdomain"
    return None


def claim_ref_problem(ref: ClaimRef) -> str | None:
    """Why the kubelet's reference cannot name a ResourceClaim, or None when it can."""
    problem = object_name_problem(ref.namespace, ref.name)
    if problem:
        return problem
    if not is_uid(ref.uid):
        return f"claim UID {shown(ref.uid)} is not a UID (1-128 letters, digits, '-', '_', '.')"
    return None


def check_claim_ref(ref: ClaimRef) -> None:
    """ClaimError for a reference that cannot name a ResourceClaim."""
    problem = claim_ref_problem(ref)
    if problem:
        raise ClaimError(f"invalid claim reference: {problem}")
