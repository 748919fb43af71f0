"""``manage.py rotate_secrets``: re-encrypt every stored data-source secret with the first key.

Rotation: set ``KB_SECRETS_KEY=<new>,<old>``, run this, then drop ``<old>`` from the variable.
"""

from django.core.management.base import BaseCommand, CommandError

from projects.models import Tenant
from sources.connectors.base import ConnectorError
from sources.services import source_secrets_rotate


class Command(BaseCommand):
    help = "Re-encrypt every data source's secrets with the first KB_SECRETS_KEY key (plaintext ones too)."

    def handle(self, *args, **options):
        total = 0
        for tenant in Tenant.objects.order_by("pk"):
            try:
                count = source_secrets_rotate(tenant_id=tenant.pk)
            except ConnectorError as exc:
                raise CommandError(f"tenant {tenant.slug!r}: {exc}") from exc
            total += count
            if count:
                self.stdout.write(f"{tenant.slug}: {count} secret field(s) re-encrypted")
        self.stdout.write(f"done: {total} secret field(s) re-encrypted with the first key")
