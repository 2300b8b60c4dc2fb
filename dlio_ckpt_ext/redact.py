"""Keeping credentials out of everything we print or write.

A credential can reach us as a storage option, under any key that names one,
inside a dict-form override (`storage_options={secret_access_key: ...}`), or
in the environment; whatever its form, its value is replaced before output.
"""
from __future__ import annotations

import os
import re
from typing import Any

SECRET_WORDS = ("secret", "password", "passwd", "token", "credential", "access_key", "session", "api_key")
SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID", "AZURE_STORAGE_KEY",
              "AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_CONNECTION_STRING", "GOOGLE_APPLICATION_CREDENTIALS")
#: a connection string's own secrets, however it reaches a text
_CONNECTION_SECRET = re.compile(r"(?P<key>AccountKey|SharedAccessSignature)=(?P<value>[^;\s'\"]+)")
REDACTED = "<redacted>"
_KEY_VALUE = re.compile(r"""(?P<key>[\w.\-]*(?:%s)[\w.\-]*)(?P<sep>\s*[:=]\s*)(?P<value>'[^']*'|"[^"]*"|[^,}\s]*)"""
                        % "|".join(SECRET_WORDS), re.IGNORECASE)


def is_secret_key(key: Any) -> bool:
    return isinstance(key, str) and any(word in key.lower() for word in SECRET_WORDS)


def redact_tree(data: Any) -> Any:
    """A copy of nested dicts/lists with the values of credential keys replaced."""
    if isinstance(data, dict):
        return {k: (REDACTED if is_secret_key(k) and v not in (None, "") else redact_tree(v)) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [redact_tree(v) for v in data]
    return data


def redact_text(text: str) -> str:
    """`key=value` and `key: value` pairs whose key names a credential, in any
    text (a command line, a dict-form override, an error message), plus any
    credential value found in the environment."""
    text = _KEY_VALUE.sub(lambda m: f"{m['key']}{m['sep']}{REDACTED}", text)
    text = _CONNECTION_SECRET.sub(lambda m: f"{m['key']}={REDACTED}", text)
    for name in SECRET_ENV:
        value = os.environ.get(name)
        if value and len(value) >= 4:
            text = text.replace(value, REDACTED)
    return text


def redact_args(argv: list[str]) -> list[str]:
    """A command line with every credential value replaced."""
    return [redact_text(a) for a in argv]
