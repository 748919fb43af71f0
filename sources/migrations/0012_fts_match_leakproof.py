"""Let the planner use the full-text GIN index under row-level security.

Row-level security evaluates a table's policy before any condition of the query unless that
condition's function is LEAKPROOF (PostgreSQL manual, "Row Security Policies"). PostgreSQL
ships ``ts_match_vq`` (the ``tsvector @@ tsquery`` operator) without that mark, so under the
tenant policy every full-text match scanned all of the tenant's rows instead of the GIN index:
a 38-row match took 296 ms at 100k rows, 1.3 ms once marked (``bench/search_latency.py``).

``ts_match_vq`` returns a boolean computed from its two arguments and raises no error that
depends on a row's value (only stack-depth and interrupt checks, which depend on the query),
so evaluating it before the policy reveals nothing about rows the policy hides: the policy
still filters every row the index returns.

Marking a function needs a superuser (the embedded server's owner role is one). Without one
the migration leaves the function as it is and says so: search stays correct, only slower.
"""

from django.db import migrations

FUNCTION = "pg_catalog.ts_match_vq(tsvector, tsquery)"


def _is_superuser(schema_editor) -> bool:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
        row = cursor.fetchone()
    return bool(row and row[0])


def mark_leakproof(apps, schema_editor):
    if not _is_superuser(schema_editor):
        print(
            f"\n  note: {FUNCTION} not marked LEAKPROOF (needs a superuser); full-text search under "
            "row-level security will not use its index. As a superuser: "
            f"ALTER FUNCTION {FUNCTION} LEAKPROOF;"
        )
        return
    schema_editor.execute(f"ALTER FUNCTION {FUNCTION} LEAKPROOF")


def unmark_leakproof(apps, schema_editor):
    if _is_superuser(schema_editor):
        schema_editor.execute(f"ALTER FUNCTION {FUNCTION} NOT LEAKPROOF")


class Migration(migrations.Migration):
    dependencies = [("sources", "0011_termstat_champions")]

    operations = [migrations.RunPython(mark_leakproof, unmark_leakproof)]
