"""The ``explain`` subcommand's arguments, declared without loading the explainer (every driver command builds the
parser; the explainer and its CEL library load only when ``explain`` runs: :mod:`accel_core.dra.explain_report`)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", nargs="?", default=None,
                        help="pod/NAME, resourceclaim/NAME or resourceclaimtemplate/NAME (offline: optional, picks "
                             "one from the -f files)")
    parser.add_argument("-n", "--namespace", default=None, help="namespace (default: the kubeconfig context's, "
                        "else default)")
    parser.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: KUBECONFIG, ~/.kube/config, "
                        "then in-cluster)")
    parser.add_argument("--context", default=None, help="kubeconfig context (default: the current one)")
    parser.add_argument("-f", "--filename", action="append", type=Path, default=[],
                        help="offline: a YAML/JSON file with the pod, claim or template, and optionally "
                             "DeviceClasses and allocated ResourceClaims (repeatable)")
    parser.add_argument("--slices", action="append", type=Path, default=[],
                        help="offline: ResourceSlices, e.g. the output of `slices` (repeatable); with -f")
    parser.add_argument("-o", "--output", choices=["text", "json"], default="text")
