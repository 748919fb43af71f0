"""Encryption at rest for secrets kept in configuration (data-source tokens, passwords).

Values are encrypted with Fernet (AES-128-CBC + HMAC-SHA256, from ``cryptography``) and stored
as ``"enc:v1:<fernet token>"``. The keys come from ``settings.KB_SECRETS_KEYS``: the first
encrypts, every key decrypts (``MultiFernet``), so a key is rotated by putting a new key first,
running ``manage.py rotate_secrets`` (re-encrypts every stored value with the first key), then
dropping the old key. Keys are set by ``KB_SECRETS_KEY`` (comma-separated Fernet keys) or
generated into ``var/secrets_key``.

This module knows nothing of data sources: callers pass the names of the fields that are
secrets and a label (``"data source 'acme/slack'"``) for error messages.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings

PREFIX = "enc:v1:"
# What a form or page shows instead of a stored secret; submitting it back keeps the old value.
MASK = "•••• (set)"


class SecretsError(Exception):
    """A secret cannot be decrypted (wrong or missing key, damaged value), or a key is invalid.

    The message names the owner (label), the field, and what to do; never the value.
    """


@lru_cache(maxsize=8)
def _fernet(keys: tuple[str, ...]) -> MultiFernet:
    if not keys:
        raise SecretsError("KB_SECRETS_KEY holds no key; set it to one or more comma-separated Fernet keys")
    fernets = []
    for position, key in enumerate(keys, start=1):
        try:
            fernets.append(Fernet(key.strip().encode()))
        except (ValueError, TypeError) as exc:
            raise SecretsError(
                f"KB_SECRETS_KEY key #{position} is not a Fernet key (32 url-safe base64-encoded bytes; "
                "make one with: python -c 'from cryptography.fernet import Fernet; "
                "print(Fernet.generate_key().decode())')"
            ) from exc
    return MultiFernet(fernets)


def _keys() -> tuple[str, ...]:
    return tuple(k for k in getattr(settings, "KB_SECRETS_KEYS", ()) if k.strip())


def generate_key() -> str:
    """A new random Fernet key (44 characters of url-safe base64)."""
    return Fernet.generate_key().decode()


def is_encrypted(value: Any) -> bool:
    """True for a string in the stored form ``enc:v1:...``."""
    return isinstance(value, str) and value.startswith(PREFIX)


def encrypt_value(plaintext: str) -> str:
    """``"enc:v1:<fernet token>"`` for ``plaintext``, with the first configured key."""
    return PREFIX + _fernet(_keys()).encrypt(plaintext.encode("utf-8")).decode("ascii")


def decrypt_value(stored: str, *, label: str, field: str) -> str:
    """The plaintext of a stored ``enc:v1:`` value (any configured key may have encrypted it).

    A value without the prefix is returned as it is (written before encryption existed).
    Raises ``SecretsError`` naming ``label`` and ``field`` when no configured key opens it.
    """
    if not is_encrypted(stored):
        return stored
    try:
        return _fernet(_keys()).decrypt(stored[len(PREFIX) :].encode("ascii")).decode("utf-8")
    except (InvalidToken, UnicodeError) as exc:
        raise SecretsError(
            f"{label}: config field {field!r} cannot be decrypted with the configured KB_SECRETS_KEY "
            "(it was encrypted with another key, or the stored value is damaged); put the key it was "
            "encrypted with into KB_SECRETS_KEY (comma-separated, new key first), or enter the secret again"
        ) from exc


def rotate_value(stored: str, *, label: str, field: str) -> str:
    """``stored`` re-encrypted with the first key (a plaintext value is encrypted). Raises ``SecretsError``."""
    if not is_encrypted(stored):
        return encrypt_value(stored)
    try:
        return PREFIX + _fernet(_keys()).rotate(stored[len(PREFIX) :].encode("ascii")).decode("ascii")
    except InvalidToken as exc:
        raise SecretsError(
            f"{label}: config field {field!r} cannot be re-encrypted: no configured KB_SECRETS_KEY opens it"
        ) from exc


def encrypt_fields(config: Mapping[str, Any], fields: Iterable[str]) -> dict[str, Any]:
    """A copy of ``config`` with each named field that holds a non-empty plaintext string encrypted.

    Values already in the ``enc:v1:`` form, ``None`` and non-strings are kept as they are.
    """
    names = set(fields)
    return {
        key: encrypt_value(value)
        if key in names and isinstance(value, str) and value and not is_encrypted(value)
        else value
        for key, value in config.items()
    }


def decrypt_fields(config: Mapping[str, Any], *, label: str) -> dict[str, Any]:
    """A copy of ``config`` with every ``enc:v1:`` value decrypted. Raises ``SecretsError``."""
    return {key: decrypt_value(value, label=label, field=key) for key, value in config.items()}


def mask_fields(config: Mapping[str, Any], fields: Iterable[str]) -> dict[str, Any]:
    """A copy for display: each set secret (named, or encrypted) becomes ``MASK``."""
    names = set(fields)
    return {
        key: MASK if (is_encrypted(value) or (key in names and isinstance(value, str) and value)) else value
        for key, value in config.items()
    }
