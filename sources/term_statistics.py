"""Term statistics for rare-token tests at ingestion: IDF over a data source's ``TermStat`` rows
(``ln(N / df)``, Spärck Jones, "A statistical interpretation of term specificity", 1972), and
the bundled common English words the heuristic uses before a source has statistics.

Used by Slack burst detection (``sources.connectors.slack.distill``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path


@cache
def english_common() -> frozenset[str]:
    """The bundled 8,000 most frequent English words (lowercase)."""
    path = Path(__file__).parent / "data" / "english_common.txt"
    return frozenset(
        line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line and not line.startswith("#")
    )


def common_word(word: str) -> bool:
    """Whether ``word`` (lower case) is among the bundled common English words, as written or
    with a plain suffix (-s, -es, -ed, -d, -ing, -ly, -er, -ers) after a stem of 3+ letters."""
    common = english_common()
    if word in common:
        return True
    for suffix in ("s", "es", "ed", "d", "ing", "ly", "er", "ers"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3 and word[: -len(suffix)] in common:
            return True
    return False


class TermStatistics:
    """IDF of a run's tokens. This base class has no source statistics: the heuristic applies."""

    def has_stats(self) -> bool:
        return False

    def max_idf(self, texts: list[str]) -> list[float]:
        """The highest IDF of any lexeme of each text (0.0 when none is known)."""
        return [0.0 for _ in texts]


@dataclass
class SourceTermStatistics(TermStatistics):
    """IDF over one data source's ``TermStat`` rows: ln(N / df), N the source's indexed rows.

    Lexemes come from PostgreSQL (``to_tsvector('english', ...)``, as the search vector); a
    lexeme the source does not hold yet counts df = 1. Only lexemes with a letter and 3+
    characters count (numbers and fragments are not rare words). Reads inside the tenant's
    context.
    """

    tenant_id: int
    source_id: int
    n_rows: int

    def has_stats(self) -> bool:
        return self.n_rows > 0

    def max_idf(self, texts: list[str]) -> list[float]:
        from django.db import connection

        from kbportal.tenancy import tenant_context

        if not texts or not self.n_rows:
            return [0.0 for _ in texts]
        with tenant_context(self.tenant_id), connection.cursor() as cursor:
            cursor.execute(
                """
                SELECT t.i, min(coalesce(s.ndoc, 0))
                FROM unnest(%s::text[]) WITH ORDINALITY AS t(txt, i),
                     unnest(tsvector_to_array(to_tsvector('english', t.txt))) AS lx
                LEFT JOIN sources_termstat s ON s.source_id = %s AND s.lexeme = lx
                WHERE length(lx) >= 3 AND lx ~ '[a-z]'
                GROUP BY t.i
                """,
                [texts, self.source_id],
            )
            rarest = {int(i): int(df) for i, df in cursor.fetchall()}
        return [math.log(self.n_rows / max(rarest[i + 1], 1)) if i + 1 in rarest else 0.0 for i in range(len(texts))]
