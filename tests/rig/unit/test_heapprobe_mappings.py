"""heapprobe's split of a process's RSS by kind of mapping (the figures bench_*kubelet_restarts.py print).

Facts from glibc and Linux, not from the code: in a fresh process, a new thread's first malloc under the mmap
threshold (128 KiB) gets it an arena of its own (a 64 MiB-aligned heap whose unused rest is reserved PROT_NONE); a
thread's stack is a mapping with a guard page below it; a shared library is mapped from its file. The scenario runs
in a fresh interpreter, so no stack or arena is left over from earlier threads to be reused.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

SCENARIO = r"""
import ctypes, json, os, threading
from accel_rig.heapprobe import growth_report, resident_by_kind
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
before = resident_by_kind(os.getpid())
allocated, done = threading.Event(), threading.Event()
def worker():
    block = libc.malloc(64 << 10)
    ctypes.memset(block, 1, 64 << 10)
    allocated.set()
    done.wait(10)
thread = threading.Thread(target=worker)
thread.start()
allocated.wait(10)
during = resident_by_kind(os.getpid())
done.set()
thread.join()
print(json.dumps({"before": {k: [v.bytes, v.mappings] for k, v in before.items()},
                  "during": {k: [v.bytes, v.mappings] for k, v in during.items()},
                  "report": growth_report([before, during])}))
"""


def test_a_new_thread_shows_its_stack_and_its_malloc_arena() -> None:
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}  # glibc's default arena limit
    out = subprocess.run([sys.executable, "-c", SCENARIO], env=env, capture_output=True, text=True, check=True,
                         timeout=60)
    seen = json.loads(out.stdout)
    before, during = seen["before"], seen["during"]
    assert during["thread stacks"][1] == before.get("thread stacks", [0, 0])[1] + 1
    assert during["malloc thread arenas"][0] - before.get("malloc thread arenas", [0, 0])[0] >= 64 << 10
    assert during["file libc.so.6"][0] > 0
    assert "malloc thread arenas +" in seen["report"][0], seen["report"]
