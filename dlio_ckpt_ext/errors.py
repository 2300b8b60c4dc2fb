"""Exceptions shared by every layer."""
from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value is unknown, out of range or inconsistent.

    The message always names the key, the value given and what is allowed.
    """

    def __init__(self, key: str, value: object, allowed: str) -> None:
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"invalid config: {key}={value!r}; allowed: {allowed}")


class StorageError(OSError):
    """A storage operation failed; the message names the file or object."""

    def __init__(self, message: str, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno


class VerificationError(StorageError):
    """Data read back differs from what was written."""
