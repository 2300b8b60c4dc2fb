"""Streaming LLM checkpoint workload for the DLIO I/O benchmark."""

__version__ = "0.1.0"
