from django.apps import AppConfig
from django.db.models.signals import post_migrate


def grant_app_role(sender, using: str = "default", **kwargs) -> None:
    """After migrating as the owner, let the app role read and write (never own) the tables."""
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


class KbportalConfig(AppConfig):
    name = "kbportal"
    verbose_name = "kbportal"

    def ready(self) -> None:
        post_migrate.connect(grant_app_role, dispatch_uid="kbportal.grant_app_role")
