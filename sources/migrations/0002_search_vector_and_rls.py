from django.db import migrations

from kbportal.tenancy import enable_rls_sql

TABLES = ["sources_datasource", "sources_projectsource", "sources_ingestionrun", "sources_document"]

# Weighted full-text vector over title (A), path (B) and raw content (C). 'simple' keeps
# identifiers and error strings intact; 'english' adds stems. Stored and generated, so every
# write keeps it current; GIN-indexed for the lexical ranker.
SEARCH_VECTOR = """
ALTER TABLE sources_document ADD COLUMN search_vector tsvector GENERATED ALWAYS AS (
    setweight(to_tsvector('english'::regconfig, coalesce(title, '')), 'A') ||
    setweight(to_tsvector('simple'::regconfig, coalesce(path, '')), 'B') ||
    setweight(to_tsvector('english'::regconfig, left(coalesce(content, ''), 500000)), 'C')
) STORED;
CREATE INDEX document_search_vector_gin ON sources_document USING gin (search_vector);
"""
SEARCH_VECTOR_REVERSE = """
DROP INDEX IF EXISTS document_search_vector_gin;
ALTER TABLE sources_document DROP COLUMN IF EXISTS search_vector;
"""


class Migration(migrations.Migration):
    dependencies = [("sources", "0001_initial")]

    operations = [migrations.RunSQL(SEARCH_VECTOR, SEARCH_VECTOR_REVERSE)] + [
        migrations.RunSQL(*enable_rls_sql(table)) for table in TABLES
    ]
