"""The agent zygote takes the C heap's free chunks before it forks (`agent_zygote.take_free_heap_chunks`), so that a
forked run's allocations do not reuse them: each reuse wrote to a page the child shares with the zygote, and the
kernel copied it. Checked in a fresh interpreter with glibc's own account of its heap (`mallinfo2`)."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys

import pytest

SCRIPT = """
import ctypes, json
from labkube.operator.agent_zygote import take_free_heap_chunks

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2

def free_outside_top():
    info = libc.mallinfo2()
    return info.fordblks - info.keepcost

kept = [bytes(600 + i % 400) for i in range(4000)]  # over 512 bytes: from malloc, not Python's own allocator
del kept[::2]  # every other one freed: holes between the ones kept
before = free_outside_top()
taken = take_free_heap_chunks()
print(json.dumps({"before": before, "taken": taken, "after": free_outside_top()}))
"""


@pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "mallinfo2"), reason="glibc 2.33 or later only")
def test_the_zygote_leaves_no_free_heap_chunk_for_a_child_to_reuse() -> None:
    out = subprocess.run([sys.executable, "-P", "-c", SCRIPT], capture_output=True, text=True, check=True).stdout
    heap = json.loads(out)
    assert heap["before"] > 500_000  # the holes were there
    assert heap["after"] == 0
    assert heap["taken"] < heap["before"] + 1_000_000  # what was free, and little of the top
