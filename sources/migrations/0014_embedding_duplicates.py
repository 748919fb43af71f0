"""One copy of each embedded text in the HNSW index.

Identical vectors trap an HNSW graph search (copies link only to each other; a search entering
the group cannot leave it: pgvector#837, qdrant#10239). On the FastAPI corpus, 1,186 commits
"📝 Update release notes" share one vector, and for 25 of 234 development questions the index
returned worse nearest neighbours than an exact scan. ``embedding_duplicate`` marks every copy
but the first of a text within one source, kind and set of principals; the index leaves them out.
An index on ``(source_id, md5(text))`` lets a live update refresh the marks of the rows holding
its texts without reading the whole source.
"""

import django.db.models.functions.text
import pgvector.django.indexes
from django.db import migrations, models

MARK = """
UPDATE sources_document d SET embedding_duplicate = true
FROM (
    SELECT id, row_number() OVER (PARTITION BY source_id, kind, md5(text), principals ORDER BY id) AS k
    FROM sources_document WHERE embedding IS NOT NULL
) g
WHERE d.id = g.id AND g.k > 1
"""


class Migration(migrations.Migration):
    dependencies = [
        ("projects", "0005_project_membership"),
        ("sources", "0013_restricted_rows_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="document",
            name="embedding_duplicate",
            field=models.BooleanField(
                db_default=False,
                default=False,
                help_text="Another row of the source, readable by the same principals, holds the same embedded text: "
                "left out of the HNSW index (sources.services.term_stats.source_refresh_embedding_duplicates).",
            ),
        ),
        migrations.RunSQL(MARK, migrations.RunSQL.noop),
        migrations.RemoveIndex(model_name="document", name="document_embedding_hnsw"),
        migrations.AddIndex(
            model_name="document",
            index=pgvector.django.indexes.HnswIndex(
                condition=models.Q(("embedding_duplicate", False)),
                ef_construction=64,
                fields=["embedding"],
                m=16,
                name="document_embedding_hnsw",
                opclasses=["vector_cosine_ops"],
            ),
        ),
        migrations.AddIndex(
            model_name="document",
            index=models.Index(
                models.F("source"), django.db.models.functions.text.MD5("text"), name="document_text_md5_idx"
            ),
        ),
    ]
