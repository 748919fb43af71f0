"""Partial indexes over the rows restricted to named principals (private channels, restricted pages).

Retrieval's term statistics (``sources_termstat``) count every row of a source, restricted ones
too. ``search.retrieval.query.query_terms`` takes from them the rows the asker may not read, so
no weight or term choice depends on what a restricted row holds; these indexes keep that lookup
proportional to the (few) restricted rows, not to every row holding a common word.
"""

from django.db import migrations

CREATE = """
CREATE INDEX IF NOT EXISTS document_restricted_search_vector_gin
    ON sources_document USING gin (search_vector) WHERE principals <> '[]'::jsonb;
CREATE INDEX IF NOT EXISTS document_restricted_source_idx
    ON sources_document (source_id) WHERE principals <> '[]'::jsonb;
"""
DROP = """
DROP INDEX IF EXISTS document_restricted_search_vector_gin;
DROP INDEX IF EXISTS document_restricted_source_idx;
"""


class Migration(migrations.Migration):
    dependencies = [("sources", "0012_fts_match_leakproof")]

    operations = [migrations.RunSQL(CREATE, DROP)]
