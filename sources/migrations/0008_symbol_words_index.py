"""A GIN index on the words of each code row's symbol name (``search.retrieval.symbol_name_ranking``).

The expression must stay textually equal to ``search.retrieval.SYMBOL_WORDS_SQL`` (without the
``d.`` alias) for the planner to use it; ``tests/search/test_retrieval.py`` checks that it does.
"""

from django.db import migrations

EXPRESSION = (
    "to_tsvector('english', regexp_replace(regexp_replace(regexp_replace(coalesce(metadata->>'symbol', ''), "
    "'([A-Z]+)([A-Z][a-z])', '\\1 \\2', 'g'), '([a-z0-9])([A-Z])', '\\1 \\2', 'g'), '[_.]', ' ', 'g'))"
)


class Migration(migrations.Migration):
    dependencies = [("sources", "0007_slack_event_seen")]

    operations = [
        migrations.RunSQL(
            f"CREATE INDEX IF NOT EXISTS document_symbol_words_gin ON sources_document USING gin (({EXPRESSION})) "
            "WHERE metadata ? 'symbol'",
            "DROP INDEX IF EXISTS document_symbol_words_gin",
        )
    ]
