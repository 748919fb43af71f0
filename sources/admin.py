from django import forms
from django.contrib import admin, messages
from django.contrib.admin.models import ADDITION, CHANGE

from kbportal.admin import OwnerDatabaseAdmin, OwnerDatabaseInline
from sources.models import DataSource, Document, IngestionRun, ProjectSource


class ProjectSourceInline(OwnerDatabaseInline):
    model = ProjectSource


class DataSourceForm(forms.ModelForm):
    """Validates ``config`` with the connector's pydantic model, naming each invalid field.

    Secrets never reach the page: a stored secret is shown as ``•••• (set)``, and leaving that
    text in place keeps the stored (encrypted) value; a new secret is encrypted before saving.
    ``"allow_private_network": true`` lets this source reach private/loopback addresses.
    """

    class Meta:
        model = DataSource
        fields = "__all__"
        help_texts = {
            "config": "JSON, validated by the connector. Secrets show as •••• (set): leave them to keep the "
            'stored value. "allow_private_network": true lets URLs reach private or loopback addresses.'
        }

    def __init__(self, *args, **kwargs):
        from kbportal.secrets import mask_fields
        from sources.connectors.registry import secret_fields

        super().__init__(*args, **kwargs)
        if self.instance.pk and isinstance(self.instance.config, dict):
            self.initial["config"] = mask_fields(self.instance.config, secret_fields(self.instance.kind))

    def clean(self):
        from sources.connectors.base import ConnectorError
        from sources.connectors.registry import build_connector
        from sources.services import config_merge_secrets

        data = super().clean()
        kind = data.get("kind", "")
        old = self.instance.config if self.instance.pk and isinstance(self.instance.config, dict) else {}
        label = f"data source {self.instance.slug!r}" if self.instance.pk else f"a {kind!r} data source"
        try:
            config = config_merge_secrets(kind=kind, old=old, new=data.get("config") or {}, label=label)
            build_connector(kind, config, include=data.get("include"), exclude=data.get("exclude"))
        except ConnectorError as exc:
            raise forms.ValidationError(str(exc)) from exc
        data["config"] = config
        return data


@admin.register(DataSource)
class DataSourceAdmin(OwnerDatabaseAdmin):
    form = DataSourceForm
    list_display = [
        "name",
        "slug",
        "kind",
        "tenant",
        "enabled",
        "sync_interval_minutes",
        "last_success_at",
        "consecutive_failures",
        "backoff_until",
        "generation",
    ]
    # The schedule is edited here: the beat dispatcher (sources.scheduling) reads these fields.
    list_editable = ["enabled", "sync_interval_minutes"]
    list_filter = ["tenant", "kind", "enabled"]
    search_fields = ["name", "slug"]
    readonly_fields = [
        "generation",
        "last_synced_at",
        "public_id",
        "last_attempt_at",
        "last_success_at",
        "consecutive_failures",
        "backoff_until",
        "last_error",
    ]
    inlines = [ProjectSourceInline]
    actions = ["sync_now"]
    # A source added or edited here is audited as source.create / source.update (with
    # "via": "admin"), like one made through sources.services.
    audit_actions = {ADDITION: "source.create", CHANGE: "source.update"}

    @admin.action(description="Sync now (queue an ingestion run)")
    def sync_now(self, request, queryset):
        """Queue a run of each selected source through ``sources.scheduling.source_sync_queue``
        (the path of the schedule, the API and webhooks): ``source.sync`` audit event, task sent
        on commit; the worker's per-source lock refuses a run while another is in progress."""
        from sources.scheduling import source_sync_queue

        sources = [(source.tenant_id, source.pk) for source in queryset]
        for tenant_id, source_id in sources:
            source_sync_queue(tenant_id=tenant_id, source_id=source_id, via="admin", actor=request.user)
        messages.success(request, f"Queued {len(sources)} ingestion run(s).")


@admin.register(IngestionRun)
class IngestionRunAdmin(OwnerDatabaseAdmin):
    list_display = [
        "source",
        "status",
        "seen",
        "created",
        "updated",
        "deleted",
        "embedded",
        "skipped",
        "started_at",
        "finished_at",
    ]
    list_filter = ["status", "tenant"]
    readonly_fields = [f.name for f in IngestionRun._meta.fields]


@admin.register(Document)
class DocumentAdmin(OwnerDatabaseAdmin):
    list_display = ["title", "kind", "source", "path", "updated_at"]
    list_filter = ["kind", "tenant"]
    search_fields = ["title", "path", "external_id"]
    exclude = ["embedding"]
    readonly_fields = ["content_hash", "generation", "indexed_at"]
