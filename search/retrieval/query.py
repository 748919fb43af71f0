"""The question as retrieval reads it: the one length check, its full-text terms and their
document frequencies in the scope, the identifiers it names, and the kinds of rows it asks for."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db import connection

from sources.selectors import QueryScope
from sources.text import identifier_terms

MAX_QUERY_CHARS = 2000
MAX_LEXICAL_TOKENS = 64  # PostgreSQL's tsquery parser recurses per operator: keep the OR chain short


class InvalidQuery(ValueError):
    """The question cannot be asked as it is; the message says why, for the asker."""


class EmptyQuery(InvalidQuery):
    """The question has no searchable text."""


class QueryTooLong(InvalidQuery):
    """The question is longer than ``MAX_QUERY_CHARS``."""


def clean_query(query: str | None) -> str:
    """The question as searched: NUL and unpaired surrogates removed, whitespace collapsed.

    The one check every path (web page, stream, API, MCP, ``manage.py ask``) applies: raises
    ``EmptyQuery`` when nothing is left and ``QueryTooLong`` (naming both lengths) when more than
    ``MAX_QUERY_CHARS`` characters are."""
    text = (query or "").replace("\x00", " ")
    text = text.encode("utf-8", "replace").decode("utf-8")
    text = " ".join(text.split())
    if not text:
        raise EmptyQuery("the question is empty; type what you are looking for")
    if len(text) > MAX_QUERY_CHARS:
        raise QueryTooLong(f"the question is {len(text):,} characters long; at most {MAX_QUERY_CHARS:,} are allowed")
    return text


COMMON_DF_RATIO = 0.25  # a lexeme in more than a quarter of the scope's rows is dropped from the OR query
MAX_TERM_DF = 5000  # ... and so is one in more than 5,000 rows (IDF < 3 at 100k rows; it costs the most)
KEEP_RAREST = 3  # ... unless every lexeme is that common: then the rarest few are kept
MIN_TERM_IDF = 0.1  # a kept term every row holds still counts a little in the IDF-weighted sum
RARE_IDF = 4.0  # the design's rare-token threshold: ln(N / df) >= 4.0
MAX_RARE_TERMS = 8
ALL_TERMS_BUDGET = 2000  # rows holding every term join the champion candidates when about this many


@dataclass
class QueryTerms:
    """The question's full-text terms with their document frequencies in the scope.

    ``df`` maps each lexeme (English-stemmed words and 'simple' identifier forms) to the number
    of rows in the scope's sources holding it; ``n_rows`` is the rows in those sources.
    """

    lexemes: list[str]
    df: dict[str, int]
    n_rows: int
    phrases: str  # quoted phrases, websearch syntax
    negative: str
    # lexeme -> the scope's sources that keep no champion list for it (rank those rows directly);
    # only lexemes with a champion list in at least one source appear here
    unchampioned: dict[str, list[int]] = field(default_factory=dict)

    def championed(self, lexeme: str) -> bool:
        """True when some source in scope keeps a champion list for ``lexeme``."""
        return lexeme in self.unchampioned

    def idf(self, lexeme: str) -> float:
        """ln(N / df) (Spärck Jones, 1972); 0 for a lexeme no row holds."""
        df = self.df.get(lexeme, 0)
        return math.log(self.n_rows / df) if df and self.n_rows else 0.0

    def kept(self) -> list[str]:
        """Lexemes for the OR query: present in the scope and not near-ubiquitous."""
        present = [lx for lx in self.lexemes if self.df.get(lx)]
        if not self.n_rows:
            return self.lexemes
        kept = [
            lx
            for lx in present
            if self.df[lx] / self.n_rows <= COMMON_DF_RATIO and (self.df[lx] <= MAX_TERM_DF or self.championed(lx))
        ]
        return kept or sorted(present, key=lambda lx: self.df[lx])[:KEEP_RAREST]

    def rare(self) -> list[tuple[str, float]]:
        """``(lexeme, idf)`` with idf >= ``RARE_IDF``, rarest first, at most ``MAX_RARE_TERMS``."""
        rare = [(lx, self.idf(lx)) for lx in self.lexemes if self.df.get(lx) and self.idf(lx) >= RARE_IDF]
        return sorted(rare, key=lambda item: -item[1])[:MAX_RARE_TERMS]


def tsquery_literal(lexemes: Iterable[str]) -> str:
    quoted = ["'" + lx.replace("\\", "\\\\").replace("'", "''") + "'" for lx in lexemes]
    return " | ".join(quoted)


# Rows of the scope's sources restricted to principals the asker holds none of (partial indexes,
# sources migration 0013); the row-level-security context keeps them to the tenant.
_UNREADABLE = (
    "d.source_id = ANY(%(sources)s) AND d.principals <> '[]'::jsonb AND NOT (d.principals ?| %(principals)s::text[])"
)


def query_terms(query: str, scope: QueryScope) -> QueryTerms:
    """Parse the question and look up its lexemes' document frequencies: from the term statistics,
    less the restricted rows the asker may not read (so nothing here depends on what such a row
    holds). Three queries; runs in the caller's tenant context."""
    positive, negative = _split_query(query)
    phrases = " ".join(t for t in _QUERY_TOKEN.findall(positive) if t.startswith('"'))
    plain = " ".join(t for t in _QUERY_TOKEN.findall(positive) if not t.startswith('"'))
    with connection.cursor() as cursor:
        cursor.execute(
            """
            WITH lx AS (
                SELECT DISTINCT unnest(tsvector_to_array(to_tsvector('english', %(plain)s))) AS lexeme
                UNION
                SELECT unnest(tsvector_to_array(to_tsvector('simple', %(terms)s)))
            )
            SELECT lx.lexeme, coalesce(sum(t.ndoc), 0)::bigint, bool_or(t.champions IS NOT NULL),
                   array_agg(t.source_id) FILTER (WHERE t.champions IS NULL)
            FROM lx LEFT JOIN sources_termstat t ON t.lexeme = lx.lexeme AND t.source_id = ANY(%(sources)s)
            GROUP BY lx.lexeme
            """,
            {"plain": plain, "terms": identifier_terms(plain), "sources": list(scope.allowed_source_ids)},
        )
        df, unchampioned = {}, {}
        for lexeme, n, has_champions, without in cursor.fetchall():
            df[lexeme] = int(n)
            if has_champions:
                unchampioned[lexeme] = [int(x) for x in without or []]
        cursor.execute(
            "SELECT coalesce(sum(indexed_rows), 0) FROM sources_datasource WHERE id = ANY(%s)",
            [list(scope.allowed_source_ids)],
        )
        n_rows = int(cursor.fetchone()[0])
        # The statistics count restricted rows too: take away those the asker may not read, so
        # that which terms count and how much never depends on what such a row holds.
        hidden: dict[str, Any] = {
            "sources": list(scope.allowed_source_ids),
            "principals": [p for p in scope.principals if p],
        }
        cursor.execute(f"SELECT count(*) FROM sources_document d WHERE {_UNREADABLE}", hidden)
        n_rows = max(0, n_rows - int(cursor.fetchone()[0]))
        present = [lx for lx, n in df.items() if n]
        if present:
            cursor.execute(
                f"""
                SELECT l.lexeme, count(d.id) FROM unnest(%(lexemes)s::text[]) AS l(lexeme)
                JOIN sources_document d ON d.search_vector @@ quote_literal(l.lexeme)::tsquery AND {_UNREADABLE}
                GROUP BY l.lexeme
                """,
                {**hidden, "lexemes": present},
            )
            for lexeme, n in cursor.fetchall():
                df[lexeme] = max(0, df[lexeme] - int(n))
    return QueryTerms(
        lexemes=sorted(df), df=df, n_rows=n_rows, phrases=phrases, negative=negative, unchampioned=unchampioned
    )


_QUERY_TOKEN = re.compile(r'-?"[^"]*"|\S+')


def _split_query(query: str) -> tuple[str, str]:
    """``(positive, negative)`` websearch texts: ``-word`` / ``-"phrase"`` go to ``negative``.

    At most ``MAX_LEXICAL_TOKENS`` positive tokens are kept, each once; identifiers also add
    their parts (``jsonable_encoder`` -> ``jsonable encoder``) for the stemmed English match.
    """
    positive: list[str] = []
    negative: list[str] = []
    seen: set[str] = set()
    for token in _QUERY_TOKEN.findall(query):
        if token.startswith("-") and len(token) > 1:
            negative.append(token[1:])
            continue
        for piece in [token, *_identifier_pieces(token)]:
            key = piece.lower()
            if key not in seen and len(positive) < MAX_LEXICAL_TOKENS:
                seen.add(key)
                positive.append(piece)
    return " ".join(positive), " ".join(negative)


def _identifier_pieces(token: str) -> list[str]:
    if token.startswith('"'):
        return []
    pieces = [p for p in _SYMBOLS.split(token) if p]
    return pieces if len(pieces) > 1 else []


def query_identifiers(query: str) -> list[str]:
    """Code identifiers named in the question (lowercased, each once): `quoted`, snake_case,
    camelCase, CamelCase with two humps, dotted.names (their last part)."""
    names: list[str] = []
    for match in _CODE_IDENTIFIER.finditer(query):
        name = match.group(0).strip("`").rstrip("()").split(".")[-1].lower()
        if len(name) > 2 and name not in names:
            names.append(name)
    return names


_CODE_WORDS = re.compile(
    r"\b(which|what)\s+(\w+\s+)?(function|functions|class|classes|method|methods|decorator|exception|error|"
    r"module|helper|object|type)\b|\bwhere\s+(is|are|does)\b.*\b(defined|implemented|declared|lives?)\b|"
    # "where does <something> <do something>": where a behaviour lives (not "where do I ...")
    r"\bwhere\s+(does|do)\s+(?!I\b|we\b|you\b)(the\s+|a\s+|an\s+)?[\w.]+\s+[a-z]+s?\b|"
    r"\bshow me\b|\bsource code\b|\bimplementation\b",
    re.I,
)
# Identifiers are case-sensitive shapes: snake_case, camelCase, CamelCase with two humps, `quoted`.
_CODE_IDENTIFIER = re.compile(
    r"`[^`]+`|\b_*[a-z][a-z0-9]*_[a-z0-9_]+\b|\b[a-z]+[A-Z]\w*\b|\b[A-Z][a-z0-9]+[A-Z][a-z]\w*\b"
)
_HISTORY_WORDS = re.compile(
    r"\b(recent|recently|latest|last)\s+(\w+\s+)?(change|changes|fix|fixes|commit|commits|release|PRs?)\b|"
    r"\b(commits?|pull requests?|PRs?|changelog|what changed|was fixed|got fixed|regression)\b",
    re.I,
)
# "How do I / how can we / how to ...": a task, which guides and tutorials explain (the definitions
# that implement it answer "which function ..." instead).
_HOW_TO_WORDS = re.compile(r"\bhow\s+(?:do|can|could|should|would)\s+(?:I|we|you|one)\b|\bhow\s+to\b", re.I)
_INTENTS: dict[str, tuple[tuple[re.Pattern[str], ...], tuple[str, ...]]] = {
    "code": ((_CODE_WORDS, _CODE_IDENTIFIER), ("code_chunk", "code_file")),
    "history": ((_HISTORY_WORDS,), ("commit", "pr")),
    "docs": ((_HOW_TO_WORDS,), ("doc_section", "doc_page")),
}


_ASKED_KIND = re.compile(
    r"\b(?:which|what)\s+(?:\w+\s+)?(class|classes|exception|exceptions|error|errors|function|functions|"
    r"method|methods|decorator|decorators)\b",
    re.I,
)


def asked_symbol_kinds(query: str) -> tuple[str, ...]:
    """The definition kinds a "which class / function ..." question asks for: ``("class",)``
    for a class, exception or error; ``("function", "method")`` for a function, method or
    decorator; ``()`` otherwise."""
    match = _ASKED_KIND.search(query)
    if not match:
        return ()
    word = match.group(1).lower()
    return ("class",) if word.startswith(("class", "exception", "error")) else ("function", "method")


def query_intents(query: str) -> dict[str, tuple[str, ...]]:
    """Families of row kinds the question explicitly asks for: ``{"code": kinds, ...}``.

    "Which function...", "where is X defined", a named identifier -> code; "recent change",
    "commit", "PR" -> history; "how do I ...", "how to ..." -> docs (guides explain a task).
    Matching is on the question's wording, never on a data set.
    """
    return {name: kinds for name, (patterns, kinds) in _INTENTS.items() if any(p.search(query) for p in patterns)}


_SYMBOLS = re.compile(r"[_./:()\[\]{}<>=,;`'\"]+")
