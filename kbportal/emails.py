"""Comparing email addresses without Unicode case folding.

Only ASCII letters are lower-cased: ``str.lower()`` folds the Kelvin sign (U+212A) into ``k``
and PostgreSQL's case-insensitive match folds the dotless ``ı`` into ``I``, so two different
addresses would compare equal and one person could claim another's identity.
"""

from __future__ import annotations


def email_key(address: str | None) -> str:
    """``address`` stripped, with ASCII letters lower-cased (other characters kept as they are);
    ``""`` for something that is not an address (empty, no ``@``, or inner whitespace)."""
    value = (address or "").strip()
    if "@" not in value or any(c.isspace() for c in value):
        return ""
    return "".join(c.lower() if "A" <= c <= "Z" else c for c in value)
