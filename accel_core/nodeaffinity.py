"""Does a pod spec's node selection pick a Node with these labels? (``nodeSelector`` and required node affinity.)

The rules, from the Kubernetes API reference for ``NodeSelector``/``NodeSelectorTerm``/``NodeSelectorRequirement``:
every ``nodeSelector`` pair must match; of ``requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms`` at
least one term must match (an empty list, or an empty term, matches no node); within a term every requirement
matches. Operators: ``In``, ``NotIn``, ``Exists``, ``DoesNotExist``, ``Gt``, ``Lt`` (integers; a label that is not
one does not match). ``matchFields`` supports ``metadata.name``, the one field the API allows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def _int(text: str | None) -> int | None:
    """A decimal integer in ASCII digits with an optional sign, else None (no odd Unicode digits)."""
    if text is None:
        return None
    digits = text[1:] if text[:1] in ("+", "-") else text
    return int(text) if digits.isascii() and digits.isdigit() else None


def requirement_matches(req: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, op = req.get("key", ""), req.get("operator", "")
    values: Sequence[str] = req.get("values") or ()
    present = key in labels
    value = labels.get(key)
    if op == "In":
        return present and value in values
    if op == "NotIn":
        return not present or value not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt") and len(values) == 1:
        have, bound = _int(value), _int(values[0])
        if have is None or bound is None:
            return False
        return have > bound if op == "Gt" else have < bound
    return False  # an unknown operator matches nothing (the API server refuses it anyway)


def term_matches(term: Mapping[str, Any], labels: Mapping[str, str], node_name: str = "") -> bool:
    exprs = term.get("matchExpressions") or ()
    fields = term.get("matchFields") or ()
    if not exprs and not fields:
        return False
    return (all(requirement_matches(r, labels) for r in exprs)
            and all(requirement_matches(r, {"metadata.name": node_name}) for r in fields))


def selects_node(pod_spec: Mapping[str, Any], labels: Mapping[str, str], node_name: str = "") -> bool:
    """True when a pod with this spec may run on a Node with ``labels`` (taints are not considered)."""
    for key, value in (pod_spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return False
    required = (((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if required is None:
        return True
    return any(term_matches(t, labels, node_name) for t in required.get("nodeSelectorTerms") or ())
