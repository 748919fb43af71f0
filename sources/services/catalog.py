"""Data sources as records: creating one (with its projects), its configuration and encrypted
secrets, and the queued run "sync now" and the scheduler create before enqueuing."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.utils.text import slugify

from kbportal.audit import audit_record
from kbportal.secrets import MASK, SecretsError, decrypt_value, encrypt_fields, is_encrypted, rotate_value
from kbportal.tenancy import tenant_context
from sources.connectors.base import ConnectorError
from sources.connectors.registry import build_connector, secret_fields
from sources.models import DataSource, IngestionRun, ProjectSource


def source_create(
    *,
    tenant_id: int,
    kind: str,
    name: str,
    config: dict[str, Any],
    slug: str | None = None,
    include: list[str] | None = None,
    exclude: list[str] | None = None,
    sync_interval_minutes: int = 60,
    project_ids: Iterable[int] = (),
) -> DataSource:
    """Create a data source after validating ``config`` with its connector's model.

    Secret fields (``sources.connectors.registry.secret_fields``) are stored encrypted
    (``enc:v1:...``). URL fields must reach public addresses unless ``config`` carries
    ``"allow_private_network": true`` (callers are operators: the admin, management commands).
    Raises ``ConnectorError`` naming the kind and the invalid fields or the refused address.
    Runs inside the tenant's context; attaches the source to ``project_ids`` (projects of the
    same tenant). Writes the ``source.create`` audit event in the same transaction (config field
    names only: values may be secrets).
    """
    build_connector(kind, config, include=include, exclude=exclude)  # validation only
    with tenant_context(tenant_id):
        source = DataSource.objects.create(
            tenant_id=tenant_id,
            kind=kind,
            name=name,
            slug=slug or slugify(name)[:80] or kind,
            config=encrypt_fields(config, secret_fields(kind)),
            include=list(include or []),
            exclude=list(exclude or []),
            sync_interval_minutes=sync_interval_minutes,
        )
        for project_id in project_ids:
            ProjectSource.objects.create(tenant_id=tenant_id, project_id=project_id, source=source)
        audit_record(
            action="source.create",
            tenant_id=tenant_id,
            object_type="sources.datasource",
            object_id=source.pk,
            data={
                "source": source.slug,
                "kind": kind,
                "name": name,
                "config_keys": sorted(config),
                "projects": list(project_ids),
            },
        )
    return source


def source_label(source: DataSource) -> str:
    """How errors name a source: ``data source 'slug'``."""
    return f"data source {source.slug!r}"


def config_merge_secrets(*, kind: str, old: dict[str, Any], new: dict[str, Any], label: str) -> dict[str, Any]:
    """The config to store when ``new`` replaces ``old``: a secret left as ``MASK`` (what forms
    show) or equal to the stored plaintext keeps its stored ciphertext; other secrets are
    encrypted. Raises ``ConnectorError`` when ``MASK`` names a secret that was never set."""
    secrets = secret_fields(kind)
    merged: dict[str, Any] = {}
    for key, value in new.items():
        stored = old.get(key)
        if value == MASK:
            if stored is None:
                raise ConnectorError(f"{label}: config field {key!r} is {MASK!r} but no secret is stored; enter it")
            merged[key] = stored
        elif is_encrypted(stored) and isinstance(value, str) and not is_encrypted(value):
            try:
                same = decrypt_value(str(stored), label=label, field=key) == value
            except SecretsError:
                same = False
            merged[key] = stored if same else value
        else:
            merged[key] = value
    return encrypt_fields(merged, secrets)


def source_update_config(*, tenant_id: int, source_id: int, config: dict[str, Any]) -> DataSource:
    """Replace a source's config after validating it (secrets handled as in ``source_create``;
    a secret given as ``kbportal.secrets.MASK`` keeps its stored value). Raises ``ConnectorError``.
    Writes the ``source.update`` audit event in the same transaction (the names of the fields
    that changed, never values)."""
    with tenant_context(tenant_id):
        source = DataSource.objects.get(pk=source_id)
        label = source_label(source)
        config = config_merge_secrets(kind=source.kind, old=source.config, new=config, label=label)
        build_connector(source.kind, config, include=source.include, exclude=source.exclude, source_label=label)
        changed = sorted(k for k in set(source.config) | set(config) if source.config.get(k) != config.get(k))
        source.config = config
        source.save(update_fields=["config"])
        audit_record(
            action="source.update",
            tenant_id=tenant_id,
            object_type="sources.datasource",
            object_id=source.pk,
            data={"source": source.slug, "changed_keys": changed},
        )
    return source


def source_secrets_rotate(*, tenant_id: int) -> int:
    """Re-encrypt every stored secret of the tenant's data sources with the first
    ``KB_SECRETS_KEY`` (plaintext secrets left from before encryption are encrypted too).

    Returns the number of fields rewritten. Raises ``ConnectorError`` naming the source and field
    when no configured key opens a value; sources before it stay rotated (one transaction each).
    """
    rotated = 0
    with tenant_context(tenant_id):
        sources = list(DataSource.objects.all())
    for source in sources:
        names = secret_fields(source.kind)
        config, count = dict(source.config), 0
        for key, value in source.config.items():
            if isinstance(value, str) and value and (is_encrypted(value) or key in names):
                try:
                    config[key] = rotate_value(value, label=source_label(source), field=key)
                except SecretsError as exc:
                    raise ConnectorError(str(exc)) from exc
                count += 1
        if count:
            with tenant_context(tenant_id):
                DataSource.objects.filter(pk=source.pk).update(config=config)
            rotated += count
    return rotated


def ingestion_run_create(*, tenant_id: int, source_id: int) -> IngestionRun:
    """A queued run for the source (what "sync now" and the scheduler create before enqueuing)."""
    with tenant_context(tenant_id):
        source = DataSource.objects.get(pk=source_id)
        return IngestionRun.objects.create(tenant_id=tenant_id, source=source)
