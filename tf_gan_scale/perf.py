"""Process-level performance settings, applied by the binaries before TensorFlow starts.

glibc malloc serves large blocks (activations of a few MB) with mmap and returns freed
memory to the OS; TensorFlow on CPU then pays page faults to re-zero the same memory at
every step. Measured on this project's 2-core CI machine with the tutorial DCGAN at global
batch 256 (tools/benchmark.py): under a tf.distribute strategy, system time rose from
3 s to 32-37 s per ~90 s run and steps were ~50% slower. Keeping freed memory in the heap
(as `MALLOC_MMAP_THRESHOLD_` / `MALLOC_TRIM_THRESHOLD_` would) removes it. The cost: the
process keeps its peak heap instead of shrinking after it.
"""

import ctypes
import ctypes.util

_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
_GIB = 2 ** 30


def tune_malloc():
    """Keeps freed memory for reuse (glibc only; a no-op elsewhere). Returns True if set."""
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, _GIB)
                and mallopt(_M_TRIM_THRESHOLD, 2 * _GIB - 1)
                and mallopt(_M_TOP_PAD, _GIB // 2))
