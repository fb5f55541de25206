"""``<driver> explain``: run the explainer on what :mod:`accel_core.dra.explain_source` read, and print the
verdict node by node (nodes with the same reasons on one line), as text or JSON."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from typing import Any

from accel_core.dra import explain_cel
from accel_core.dra.explain import Explainer, ExplainHints, NodeVerdict, compact
from accel_core.dra.explain_source import Inputs, SourceError, from_api, from_files, parse_target


def explain_inputs(inputs: Inputs, hints: ExplainHints | None = None) -> dict[str, Any]:
    """The verdict as plain data: per node ``fits`` (true, false, null: cannot tell), devices or reasons."""
    started = time.perf_counter()
    explainer = Explainer(inputs.claims, inputs.classes, inputs.slices, inputs.allocated, hints)
    nodes = explainer.nodes()
    skipped = sorted(set(nodes) - inputs.nodes) if inputs.nodes is not None else []
    if inputs.nodes is not None:
        nodes = [n for n in nodes if n in inputs.nodes]
    verdicts = [explainer.explain_node(n) for n in nodes] if inputs.claims else []
    return {
        "target": inputs.target,
        "claims": [c.label for c in inputs.claims],
        "allocated": inputs.allocated_lines,
        "requests": [_describe_request(explainer, i) for i in range(len(explainer.requests))],
        "fits": [v.node for v in verdicts if v.fits],
        "nodes": {v.node: _node(v) for v in verdicts},
        "skippedNodes": skipped,
        "notes": inputs.notes + explainer.notes(),
        "seconds": round(time.perf_counter() - started, 4),
    }


def _node(v: NodeVerdict) -> dict[str, Any]:
    return {"fits": v.fits, "reasons": v.reasons,
            "devices": [{"claim": c, "request": r, "driver": d[0], "pool": d[1], "device": d[2]}
                        for c, r, d in v.chosen]}


def _describe_request(explainer: Explainer, index: int) -> str:
    r = explainer.requests[index]
    alts = []
    for a in r.alternatives:
        amount = "all" if a.all_devices else str(a.count)
        sel = f", {len(a.selectors)} selector(s)" if a.selectors else ""
        alts.append(f"{a.name}: {amount} of class {a.class_name}{sel}" + (", admin access" if a.admin else ""))
    cons = [c.describe() for c in explainer.constraints
            if any(c.covers(r.claim, r.name, a.name) for a in r.alternatives)]
    claim = explainer.claims[r.claim].label
    return f"claim {claim}: request " + " | else ".join(alts) + (f"; {'; '.join(cons)}" if cons else "")


def render_text(result: dict[str, Any]) -> str:
    lines = [f"explain {result['target']}"]
    lines += [f"  {line}" for line in result["allocated"]]
    lines += [f"  {line}" for line in result["requests"]]
    nodes: dict[str, Any] = result["nodes"]
    if not result["claims"]:
        lines.append("nothing to place: every claim is allocated" if result["allocated"] else "no claims")
        return "\n".join(lines) + "\n"
    fits = result["fits"]
    unknown = [n for n, v in nodes.items() if v["fits"] is None]
    lines.append(f"verdict: fits on {len(fits)} of {len(nodes)} node(s)" + (f": {compact(fits)}" if fits else "")
                 + (f"; cannot tell for {len(unknown)}" if unknown else ""))
    groups: dict[tuple[Any, ...], list[str]] = defaultdict(list)
    for node, v in nodes.items():
        if v["fits"]:
            key: tuple[Any, ...] = ("fits", tuple(f"{d['request']} -> {d['device']}" for d in v["devices"]))
        else:
            key = ("cannot tell" if v["fits"] is None else "does not fit", tuple(v["reasons"]))
        groups[key].append(node)
    for (state, details), members in sorted(groups.items(), key=lambda kv: (kv[0][0] != "fits", kv[1][0])):
        who = f"node {members[0]}" if len(members) == 1 else f"nodes {compact(members)} ({len(members)})"
        if state == "fits":
            chosen: dict[str, list[str]] = defaultdict(list)
            for item in details:
                request, device = item.split(" -> ")
                chosen[request].append(device)
            lines.append(f"{who}: fits: " + "; ".join(f"{r} -> {compact(d, limit=32)}" for r, d in chosen.items()))
        else:
            lines.append(f"{who}: {state}")
            lines += [f"  - {reason}" for reason in details]
    if result["skippedNodes"]:
        lines.append(f"not considered (the pod cannot go there): {compact(result['skippedNodes'])}")
    lines += [f"note: {n}" for n in result["notes"]]
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace, prog: str, hints: ExplainHints | None) -> int:
    """The ``explain`` subcommand: 0 with a verdict, 1 when an input cannot be read, 2 for bad arguments."""
    if not explain_cel.available():
        print(f"{prog} explain: error: the CEL library is not installed: {explain_cel.INSTALL_HINT}",
              file=sys.stderr)
        return 2
    try:
        target = parse_target(args.target) if args.target else None
        if args.filename or args.slices:
            if not args.filename:
                raise SourceError("--slices needs -f with the claim, template or pod")
            inputs = from_files(args.filename, args.slices, target)
        else:
            if target is None:
                print(f"{prog} explain: error: a target (pod/NAME, resourceclaim/NAME, resourceclaimtemplate/NAME) "
                      "or -f is required", file=sys.stderr)
                return 2
            inputs = _online(args, *target)
        result = explain_inputs(inputs, hints)
    except SourceError as exc:
        print(f"{prog} explain: error: {exc}", file=sys.stderr)
        return 1
    except (AttributeError, IndexError, KeyError, TypeError, ValueError) as exc:  # an object not of its kind's shape
        where = ", ".join(str(p) for p in (*args.filename, *args.slices)) or "the objects the API server returned"
        print(f"{prog} explain: error: malformed input in {where}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    if args.output == "json":
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
    else:
        sys.stdout.write(render_text(result))
    return 0


def _online(args: argparse.Namespace, kind: str, name: str) -> Inputs:
    import httpx2
    from lightkube import Client
    from lightkube.core.exceptions import ConfigError

    from accel_core.kubeconfig import load_kubeconfig

    try:
        single = load_kubeconfig(args.kubeconfig).get(context_name=args.context)
        if single is None:
            raise ConfigError("no current context")
        client = Client(single)
    except (ConfigError, OSError, ValueError, KeyError) as exc:
        raise SourceError(f"no usable kubeconfig: {exc}") from None
    namespace = args.namespace or getattr(single, "namespace", None) or "default"
    try:
        return from_api(client, kind, name, namespace)
    except (OSError, httpx2.HTTPError) as exc:  # the API server cannot be reached
        raise SourceError(f"API server {single.cluster.server}: {exc}") from None
    finally:
        client.close()
