"""Exceptions shared by every layer."""
from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value is unknown, out of range or inconsistent.

    The message always names the key, the value given and what is allowed,
    never a credential: the value of a key that names one is redacted, and so
    is any credential inside a dict-form value.
    """

    def __init__(self, key: str, value: object, allowed: str) -> None:
        from dlio_ckpt_ext.redact import REDACTED, is_secret_key, redact_text, redact_tree
        if is_secret_key(key.rsplit(".", 1)[-1]) and value not in (None, ""):
            value = REDACTED
        elif isinstance(value, (dict, list)) or hasattr(value, "items"):
            value = redact_tree(_plain(value))
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(redact_text(f"invalid config: {key}={value!r}; allowed: {allowed}"))


def _plain(value: object) -> object:
    """An OmegaConf container as plain dicts and lists."""
    try:
        from omegaconf import OmegaConf
        return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
    except ImportError:  # pragma: no cover
        return value


class StorageError(OSError):
    """A storage operation failed; the message names the file or object."""

    def __init__(self, message: str, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno


class VerificationError(StorageError):
    """Data read back differs from what was written."""
