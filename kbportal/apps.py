from django.apps import AppConfig
from django.db.models.signals import post_migrate

# Tables the app role may only INSERT into and SELECT from (see kbportal/migrations/0001_initial.py).
APPEND_ONLY_TABLES = ("kbportal_auditevent",)


def revoke_append_only(connection) -> None:
    """Take UPDATE, DELETE and TRUNCATE on the append-only tables from the app role (no-op when
    the app connects as the owner: the tables' trigger still refuses those for every role)."""
    from django.conf import settings

    app_role = settings.DATABASES["default"].get("USER")
    if not app_role or app_role == connection.settings_dict.get("USER"):
        return
    with connection.cursor() as cursor:
        for table in APPEND_ONLY_TABLES:
            cursor.execute("SELECT to_regclass(%s)", [table])
            if cursor.fetchone()[0] is None:  # not migrated yet
                continue
            cursor.execute(f'REVOKE UPDATE, DELETE, TRUNCATE ON "{table}" FROM "{app_role}"')


def grant_app_role(sender, using: str = "default", **kwargs) -> None:
    """After migrating as the owner, let the app role read and write (never own) the tables;
    append-only tables stay INSERT and SELECT only."""
    from django.conf import settings
    from django.db import connections

    owner = settings.DATABASES[using].get("USER")
    app_role = settings.DATABASES["default"].get("USER")
    if not app_role or app_role == owner:
        return
    with connections[using].cursor() as cursor:
        cursor.execute(f'GRANT USAGE ON SCHEMA public TO "{app_role}"')
        cursor.execute(f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO "{app_role}"')
        cursor.execute(f'GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA public TO "{app_role}"')
        cursor.execute("SELECT current_setting('server_version_num')::int >= 170000")
        if cursor.fetchone()[0]:  # PostgreSQL 17+: ANALYZE after a term-statistics refresh
            cursor.execute(f'GRANT MAINTAIN ON sources_termstat TO "{app_role}"')
    revoke_append_only(connections[using])


class KbportalConfig(AppConfig):
    name = "kbportal"
    verbose_name = "kbportal"

    def ready(self) -> None:
        from kbportal.audit import audit_connect_signals

        post_migrate.connect(grant_app_role, dispatch_uid="kbportal.grant_app_role")
        audit_connect_signals()
