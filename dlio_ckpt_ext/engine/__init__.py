"""Streaming engine: generate checkpoint bytes into a bounded buffer pool and
move them to or from storage. Knows nothing of DLIO or MPI."""
from dlio_ckpt_ext.engine.buffers import BufferPool
from dlio_ckpt_ext.engine.content import ContentSpec, derive_seed
from dlio_ckpt_ext.engine.profile import FileStats, phase_report, phase_totals
from dlio_ckpt_ext.engine.stream import FileWindow, load_file, save_file, send_file, write_from_memory

__all__ = ["BufferPool", "ContentSpec", "derive_seed", "FileStats", "phase_report", "phase_totals",
           "FileWindow", "load_file", "save_file", "send_file", "write_from_memory"]
