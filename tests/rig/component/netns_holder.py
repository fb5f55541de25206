"""A process holding a network namespace of its own, for the rig's network tests."""

from __future__ import annotations

import subprocess


def holder(*setup: str) -> subprocess.Popen[bytes]:
    """A process in a new network namespace (lo up, then ``setup`` commands), sleeping until killed."""
    script = "; ".join(["set -e", "ip link set lo up", *setup, "echo ready", "exec sleep 600"])
    proc = subprocess.Popen(["unshare", "--net", "--", "/bin/sh", "-c", script], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    return proc
