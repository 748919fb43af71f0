"""Encrypt data-source secrets stored in plaintext before secrets were encrypted at rest.

Every ``sources_datasource.config`` field named like a secret (the names below, frozen here so
the migration does not change with the code) that holds a plaintext string becomes
``enc:v1:<fernet token>`` under the first ``KB_SECRETS_KEY`` key. Runs tenant by tenant with
``app.tenant_id`` set, so it works when the owner role is subject to the forced row-level
security. Reversible: the reverse decrypts.
"""

import json

from django.db import migrations

SECRET_FIELD_NAMES = ("token", "app_token", "password", "api_token", "api_key", "webhook_secret", "client_secret",
                      "secret")


def _each_source(schema_editor, apps):
    Tenant = apps.get_model("projects", "Tenant")
    alias = schema_editor.connection.alias
    tenant_ids = list(Tenant.objects.using(alias).order_by("pk").values_list("pk", flat=True))
    with schema_editor.connection.cursor() as cursor:
        for tenant_id in tenant_ids:
            cursor.execute("SELECT set_config('app.tenant_id', %s, true)", [str(tenant_id)])
            cursor.execute(
                "SELECT id, slug, config FROM sources_datasource WHERE tenant_id = %s ORDER BY id", [tenant_id]
            )
            for source_id, slug, config in cursor.fetchall():
                if isinstance(config, str):
                    config = json.loads(config)
                yield cursor, source_id, slug, config
        cursor.execute("SELECT set_config('app.tenant_id', '', true)")


def encrypt_secrets(apps, schema_editor):
    from kbportal.secrets import encrypt_fields

    for cursor, source_id, _slug, config in _each_source(schema_editor, apps):
        if not isinstance(config, dict):
            continue
        encrypted = encrypt_fields(config, SECRET_FIELD_NAMES)
        if encrypted != config:
            cursor.execute(
                "UPDATE sources_datasource SET config = %s::jsonb WHERE id = %s", [json.dumps(encrypted), source_id]
            )


def decrypt_secrets(apps, schema_editor):
    from kbportal.secrets import decrypt_fields

    for cursor, source_id, slug, config in _each_source(schema_editor, apps):
        if not isinstance(config, dict):
            continue
        plain = decrypt_fields(config, label=f"data source {slug!r}")
        if plain != config:
            cursor.execute(
                "UPDATE sources_datasource SET config = %s::jsonb WHERE id = %s", [json.dumps(plain), source_id]
            )


class Migration(migrations.Migration):
    dependencies = [("sources", "0009_source_schedule"), ("projects", "0002_row_level_security")]

    operations = [migrations.RunPython(encrypt_secrets, decrypt_secrets)]
