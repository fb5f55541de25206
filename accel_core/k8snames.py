"""Kubernetes name and UID rules, in one place: every check of a name from the kubelet, a flag, the API server or a
profile uses these, so they cannot drift apart.

Each rule is one pattern matched with ``fullmatch`` over ASCII classes (``$`` would let ``"abc\\n"`` through;
``\\d`` and ``str.isalnum`` take other scripts' digits and letters) plus a length:

- DNS-1123 label: at most 63 characters of ``[a-z0-9-]``, alphanumeric at both ends (namespaces, device names,
  request names, counter sets);
- DNS-1123 subdomain: at most 253 characters, dot-separated labels (object names, Node names, name domains);
- C identifier: ``[A-Za-z_][A-Za-z0-9_]*``, at most 32 characters in a ResourceSlice qualified name;
- qualified-name part (label keys' names and label values): at most 63 characters of ``[A-Za-z0-9_.-]``,
  alphanumeric at both ends;
- UID: the API server makes UUIDs; accepted is 1 to 128 characters of ``[A-Za-z0-9._-]`` starting with a letter
  or digit: every UUID (and a static pod's hash), and nothing unsafe in a file, socket or CDI device name.

Messages show a value cut to 64 characters (:func:`shown`).
"""

from __future__ import annotations

import re

_LABEL_TEXT = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
_LABEL = re.compile(_LABEL_TEXT, re.ASCII)
_SUBDOMAIN = re.compile(rf"{_LABEL_TEXT}(?:\.{_LABEL_TEXT})*", re.ASCII)
_C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
_NAME_PART = re.compile(r"[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?", re.ASCII)
_UID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*", re.ASCII)

LABEL_MAX = 63
SUBDOMAIN_MAX = 253
C_IDENTIFIER_MAX = 32
NAME_PART_MAX = 63
UID_MAX = 128
SHOW = 64


def shown(value: object) -> str:
    """``repr`` of a value cut to a readable length."""
    text = value if isinstance(value, str) else str(value)
    return repr(text if len(text) <= SHOW else text[:SHOW] + "...")


def _fits(pattern: re.Pattern[str], value: object, most: int) -> bool:
    return isinstance(value, str) and len(value) <= most and pattern.fullmatch(value) is not None


def is_label(value: object, most: int = LABEL_MAX) -> bool:
    """A DNS-1123 label (``most`` may only tighten the 63-character limit)."""
    return _fits(_LABEL, value, min(most, LABEL_MAX))


def is_subdomain(value: object, most: int = SUBDOMAIN_MAX) -> bool:
    """A DNS-1123 subdomain (``most`` may only tighten the 253-character limit)."""
    return _fits(_SUBDOMAIN, value, min(most, SUBDOMAIN_MAX))


def is_c_identifier(value: object, most: int = C_IDENTIFIER_MAX) -> bool:
    return _fits(_C_IDENTIFIER, value, most)


def is_name_part(value: object) -> bool:
    """The name of a qualified name (a label or taint key after its ``prefix/``), or a label value."""
    return _fits(_NAME_PART, value, NAME_PART_MAX)


def is_uid(value: object) -> bool:
    return _fits(_UID, value, UID_MAX)


def is_request_name(value: object) -> bool:
    """A request of an allocation result: a label, or ``<request>/<subrequest>``."""
    if not isinstance(value, str):
        return False
    parts = value.split("/")
    return 1 <= len(parts) <= 2 and all(is_label(p) for p in parts)


UID_RULE = "1-128 letters, digits, '-', '_', '.', starting with a letter or digit"


def object_name_problem(namespace: str, name: str) -> str | None:
    """Why ``namespace``/``name`` cannot name a namespaced object, or None when it can."""
    if not is_label(namespace):
        return f"namespace {shown(namespace)} is not a DNS-1123 label"
    if not is_subdomain(name):
        return f"claim name {shown(name)} is not a DNS-1123 subdomain"
    return None


def claim_ref_problem(namespace: str, name: str, uid: str) -> str | None:
    """Why the kubelet's reference cannot name a ResourceClaim, or None when it can."""
    problem = object_name_problem(namespace, name)
    if problem:
        return problem
    if not is_uid(uid):
        return f"claim UID {shown(uid)} is not a UID ({UID_RULE})"
    return None
