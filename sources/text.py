"""Text helpers shared by ingestion and retrieval: identifier-aware search terms.

PostgreSQL's text-search parser splits ``jsonable_encoder`` into ``jsonable`` + ``encoder`` and
keeps ``UploadFile`` whole, so neither the whole snake_case name nor the parts of a CamelCase
name are searchable as such. ``identifier_terms`` adds both forms: the identifier joined into
one lowercase token (``jsonableencoder``, ``uploadfile``, ``fastapiencoders``) and its parts
(``upload``, ``file``). Ingestion stores them in ``Document.search_terms`` (indexed with the
'simple' configuration); the lexical ranker expands the query the same way, so an identifier
typed in a question matches it exactly, and its parts still match prose.
"""

from __future__ import annotations

import re

# Identifiers worth expanding: snake_case, CamelCase/camelCase, dotted.paths, kebab-flags.
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:[.\-][A-Za-z_][A-Za-z0-9_]*)*")
_CAMEL_PARTS = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")
MAX_TERMS_CHARS = 200_000


def _is_compound(token: str) -> bool:
    if "_" in token.strip("_") or "." in token or "-" in token:
        return True
    return bool(re.search(r"[a-z][A-Z]|[A-Z]{2,}[a-z]", token))


def split_identifier(token: str) -> list[str]:
    """Lowercase parts of an identifier: ``HTTPBasicAuth`` -> ``["http", "basic", "auth"]``."""
    parts: list[str] = []
    for piece in re.split(r"[_.\-]+", token):
        parts.extend(p.lower() for p in _CAMEL_PARTS.findall(piece))
    return [p for p in parts if p]


def identifier_terms(text: str) -> str:
    """Space-separated extra search terms for the identifiers in ``text`` (each once).

    For every compound identifier: the joined lowercase form and its parts. Plain words add
    nothing (the regular full-text vector has them). Output is at most ``MAX_TERMS_CHARS``.
    """
    seen: set[str] = set()
    out: list[str] = []
    for match in _IDENTIFIER.finditer(text):
        token = match.group(0)
        if len(token) < 4 or not _is_compound(token):
            continue
        parts = split_identifier(token)
        for term in ["".join(parts), *parts]:
            if len(term) > 1 and term not in seen:
                seen.add(term)
                out.append(term)
    terms = " ".join(out)
    return terms[:MAX_TERMS_CHARS]
