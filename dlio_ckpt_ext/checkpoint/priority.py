"""The calling thread's CPU and I/O priority, lowered as nvidia-resiliency-ext
lowers Megatron-LM's persistent async checkpoint worker (`async_ckpt/core.py`,
`_set_process_qos`: nice raised to 10, never lowered; with Megatron's
`async_ckpt_io_priority` 3, ionice idle; docs/tiers.md).

Linux keeps both per thread, so a persist thread lowers itself alone and the
threads it starts inherit it; the foreground keeps its own. Lowering needs no
privilege. An I/O class applies to the I/O this thread submits (its writes and
fsync on a local or parallel file system), not to an object store's network
requests nor to the kernel's own writeback.
"""
from __future__ import annotations

import ctypes
import os
import platform
import threading

#: ioprio_set(2)'s syscall number on the machines we run on
_IOPRIO_SET = {"x86_64": 251, "aarch64": 30, "ppc64le": 273}
_IOPRIO_WHO_PROCESS = 1
_IOPRIO_CLASS_SHIFT = 13
IO_CLASSES = {"normal": 2, "idle": 3}   # best-effort (level 4, the default) and idle


def lower_this_thread(nice: int, io_class: str) -> dict:
    """Raise this thread's nice to `nice` (never lower it) and set its I/O class;
    returns what took effect (the nice, the I/O class or why it could not be set)."""
    tid = threading.get_native_id()
    if nice > os.getpriority(os.PRIO_PROCESS, tid):
        os.setpriority(os.PRIO_PROCESS, tid, nice)
    applied = {"nice": os.getpriority(os.PRIO_PROCESS, tid), "io_class": io_class}
    if io_class != "normal":
        error = _set_io_class(tid, IO_CLASSES[io_class])
        if error:
            applied["io_class"] = f"normal ({error})"
    return applied


def _set_io_class(tid: int, io_class: int) -> str:
    number = _IOPRIO_SET.get(platform.machine())
    if number is None:
        return f"no ioprio_set number known for {platform.machine()}"
    libc = ctypes.CDLL(None, use_errno=True)
    value = (io_class << _IOPRIO_CLASS_SHIFT) | (0 if io_class == 3 else 4)
    if libc.syscall(number, _IOPRIO_WHO_PROCESS, tid, value) != 0:
        return os.strerror(ctypes.get_errno())
    return ""


def io_class_of_this_thread() -> int:
    """The thread's I/O class as ioprio_get(2) reports it (0: none set, the default)."""
    number = {"x86_64": 252, "aarch64": 31, "ppc64le": 274}.get(platform.machine())
    if number is None:
        return -1
    libc = ctypes.CDLL(None, use_errno=True)
    value = libc.syscall(number, _IOPRIO_WHO_PROCESS, threading.get_native_id())
    return value >> _IOPRIO_CLASS_SHIFT if value >= 0 else -1
