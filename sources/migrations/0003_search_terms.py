from django.db import migrations, models

# The search vector gains the identifier terms (weight B, 'simple': no stemming, so the joined
# form of `jsonable_encoder` matches exactly), and reads at most 200,000 characters of content
# (a tsvector holds at most 1 MB; 500,000 characters of a 3-byte script overflowed it).
# A generated column cannot be altered: re-create.
SEARCH_VECTOR = """
DROP INDEX IF EXISTS document_search_vector_gin;
ALTER TABLE sources_document DROP COLUMN IF EXISTS search_vector;
ALTER TABLE sources_document ADD COLUMN search_vector tsvector GENERATED ALWAYS AS (
    setweight(to_tsvector('english'::regconfig, coalesce(title, '')), 'A') ||
    setweight(to_tsvector('simple'::regconfig, coalesce(path, '')), 'B') ||
    setweight(to_tsvector('simple'::regconfig, coalesce(search_terms, '')), 'B') ||
    setweight(to_tsvector('english'::regconfig, left(coalesce(content, ''), 200000)), 'C')
) STORED;
CREATE INDEX document_search_vector_gin ON sources_document USING gin (search_vector);
"""

SEARCH_VECTOR_REVERSE = """
DROP INDEX IF EXISTS document_search_vector_gin;
ALTER TABLE sources_document DROP COLUMN IF EXISTS search_vector;
ALTER TABLE sources_document ADD COLUMN search_vector tsvector GENERATED ALWAYS AS (
    setweight(to_tsvector('english'::regconfig, coalesce(title, '')), 'A') ||
    setweight(to_tsvector('simple'::regconfig, coalesce(path, '')), 'B') ||
    setweight(to_tsvector('english'::regconfig, left(coalesce(content, ''), 500000)), 'C')
) STORED;
CREATE INDEX document_search_vector_gin ON sources_document USING gin (search_vector);
"""


def backfill(apps, schema_editor):
    from sources.text import identifier_terms

    Document = apps.get_model("sources", "Document")
    batch = []
    for doc in Document._base_manager.using(schema_editor.connection.alias).only("id", "title", "content").iterator():
        doc.search_terms = identifier_terms(f"{doc.title}\n{doc.content}")
        batch.append(doc)
        if len(batch) >= 500:
            Document._base_manager.using(schema_editor.connection.alias).bulk_update(batch, ["search_terms"])
            batch = []
    if batch:
        Document._base_manager.using(schema_editor.connection.alias).bulk_update(batch, ["search_terms"])


class Migration(migrations.Migration):
    dependencies = [("sources", "0002_search_vector_and_rls")]

    operations = [
        migrations.AddField(
            model_name="document",
            name="search_terms",
            field=models.TextField(blank=True, default="", help_text="Identifier forms for full-text search."),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
        migrations.RunSQL(SEARCH_VECTOR, SEARCH_VECTOR_REVERSE),
    ]
