"""Data sources as an organization's owners and admins manage them at ``/manage/sources/``.

The operator's ``/admin/`` trusts its user with the whole machine; an organization's admin is
trusted with their organization only. So, on top of ``source_create``'s validation:

- a local ``path`` must lie inside the organization's files folder
  (``settings.KB_TENANT_FILES_ROOT / <tenant slug>``), after resolving ``..`` and symbolic
  links;
- a git source names a public ``https://`` URL without credentials (a local repository could
  point git anywhere through a ``.git`` file, ``commondir`` or alternates);
- ``allow_private_network`` is never set here; a source the operator created with it keeps it
  while none of its addresses changes; a stored secret is never sent to a changed address (it
  must be entered again); Slack's ``base_url`` stays the operator's (``OPERATOR_FIELDS``);
- uploads (a ZIP or a single file) are written under that folder: a ZIP is extracted member by
  member (no absolute paths, no ``..``, no links, at most ``settings.KB_UPLOAD_MAX_BYTES``
  unpacked), except a Slack export, which the connector reads as a ZIP.

Every write records one audit event with its actor in the write's transaction.
"""

from __future__ import annotations

import re
import shutil
import stat
import zipfile
from collections.abc import Iterable
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db import connection
from django.utils import timezone
from django.utils.text import slugify

from kbportal.audit import audit_record
from kbportal.secrets import MASK
from kbportal.tenancy import tenant_context
from projects.models import Project, Tenant
from sources.connectors.base import ConnectionCheck, ConnectorError
from sources.connectors.registry import ALLOW_PRIVATE_FIELD, URL_FIELD_NAMES, build_connector
from sources.models import DataSource, Document, ProjectSource
from sources.services.catalog import config_merge_secrets, source_create

MAX_ZIP_MEMBERS = 200_000
# Fields an organization admin never sets; a source keeps the operator's value (or the default).
# Slack's ``base_url``: slack_sdk's HTTP client follows redirects without the per-connection
# private-address guard the requests-based connectors have, so only Slack itself is reached.
OPERATOR_FIELDS: dict[str, tuple[str, ...]] = {"slack": ("base_url",)}
_URL = re.compile(r"^[a-z][a-z0-9+.-]*://|^[\w.-]+@[\w.-]+:", re.I)


def tenant_files_root(tenant: Tenant) -> Path:
    """The organization's files folder (created on first use)."""
    base = Path(settings.KB_TENANT_FILES_ROOT).resolve()
    root = (base / tenant.slug).resolve()
    if root.parent != base:
        raise ConnectorError(f"organization slug {tenant.slug!r} cannot name a files folder")
    root.mkdir(parents=True, exist_ok=True)
    return root


def managed_path(kind: str, value: str, tenant: Tenant) -> str:
    """``value`` as the absolute path to store, when an organization admin may point ``kind``
    there; raises ``ConnectorError`` naming the field otherwise. Relative paths are taken from
    the organization's files folder."""
    value = (value or "").strip()
    if kind == "git":
        # A local repository can point git anywhere (a .git file, commondir, alternates): an
        # organization names a public https:// URL; local repositories are the operator's.
        parts = urlsplit(value) if value.lower().startswith("https://") else None
        if parts is None or not parts.hostname:
            raise ConnectorError(f"path: {value[:200]!r}: a git source added here names an https:// URL")
        if parts.username or parts.password:
            raise ConnectorError("path: credentials in the URL are not accepted here; use a public repository URL")
        return value
    if _URL.match(value):
        raise ConnectorError(f"path: {value[:200]!r}: a folder of your organization's files, not a URL")
    root = tenant_files_root(tenant)
    try:
        resolved = (root / value).resolve()
    except (OSError, RuntimeError, ValueError) as exc:
        raise ConnectorError(f"path: {value[:200]!r} cannot be read: {type(exc).__name__}") from None
    if resolved != root and not resolved.is_relative_to(root):
        raise ConnectorError(
            f"path: {value[:200]!r} is outside your organization's files; upload them, or name a folder among them"
        )
    if not resolved.exists():
        raise ConnectorError(f"path: {value[:200]!r} is not among your organization's files; upload them")
    return str(resolved)


def shown_text(text: str) -> str:
    """``text`` (an error, a check's summary) as an organization sees it: a path under an
    organization's files folder written relative to that folder (as :func:`shown_path` writes a
    stored path; the folder itself as ``.``), and the server's work folder (git clones) left out.
    The server's own folders are not the organization's to know."""
    base = re.escape(str(Path(settings.KB_TENANT_FILES_ROOT).resolve()))
    text = re.sub(rf"{base}/[^/\s'\"]+/", "", text)
    text = re.sub(rf"{base}/[^/\s'\"]+(?![^\s'\"])", ".", text)
    return text.replace(str(Path(settings.KB_WORKDIR).resolve()) + "/", "")


def shown_path(path: str, tenant: Tenant) -> str:
    """A stored ``path`` as organization admins see it: relative to their files folder (the server's
    own folders are not theirs to know); a URL or a path elsewhere unchanged."""
    root = tenant_files_root(tenant)
    try:
        relative = Path(path).relative_to(root)
    except ValueError:
        return path
    return str(relative) if str(relative) != "." else "."


def upload_store(*, tenant: Tenant, kind: str, name: str, chunks: Iterable[bytes]) -> str:
    """Write an uploaded file (``name``, its content in ``chunks``) under the organization's files
    and return the path the source reads: a ZIP's extracted folder, or for a Slack export the ZIP
    itself, or the single file. Raises ``ConnectorError`` for a file over the size limit or an
    unsafe ZIP (the partial upload is removed)."""
    limit = int(settings.KB_UPLOAD_MAX_BYTES)
    safe_name = re.sub(r"[^\w.-]+", "_", Path(name or "upload").name)[:120] or "upload"
    folder = tenant_files_root(tenant) / "uploads" / f"{timezone.now():%Y%m%d-%H%M%S-%f}-{slugify(safe_name)[:40]}"
    folder.mkdir(parents=True)
    target = folder / safe_name
    try:
        written = 0
        with open(target, "xb") as out:
            for chunk in chunks:
                written += len(chunk)
                if written > limit:
                    raise ConnectorError(f"upload {name!r}: larger than the limit of {limit} bytes")
                out.write(chunk)
        if not zipfile.is_zipfile(target) or kind == "slack_export":
            return str(target)
        extracted = folder / "files"
        _extract(target, extracted, limit=limit, label=name)
        target.unlink()
        return str(extracted)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


def upload_discard(*, tenant: Tenant, path: str) -> bool:
    """Delete the upload :func:`upload_store` wrote that ``path`` lies in (its whole folder), unless
    a source of the organization still reads in it, or reads a folder holding it (each source's
    path resolved, links followed). Returns whether it was deleted."""
    uploads = tenant_files_root(tenant) / "uploads"
    target = Path(path).resolve()
    folder = next((p for p in (target, *target.parents) if p.parent == uploads), None)
    if folder is None:
        return False
    with tenant_context(tenant.pk):
        paths = [str(c.get("path") or "") for c in DataSource.objects.values_list("config", flat=True)]
    for kept in (p for p in paths if p and "://" not in p):
        try:
            resolved = Path(kept).resolve()
        except (OSError, RuntimeError, ValueError):
            continue
        if resolved.is_relative_to(folder) or folder.is_relative_to(resolved):
            return False
    shutil.rmtree(folder, ignore_errors=True)
    return True


def _extract(archive: Path, into: Path, *, limit: int, label: str) -> None:
    """Extract ``archive`` into ``into``, refusing the whole ZIP for a member that would land
    outside it or is a link, and stopping past ``limit`` unpacked bytes or too many members."""
    into.mkdir()
    try:
        _extract_members(archive, into, limit=limit, label=label)
    except (OSError, zipfile.BadZipFile, RuntimeError) as exc:  # duplicate names, a file then a folder, long names
        raise ConnectorError(f"upload {label!r}: the ZIP cannot be unpacked ({type(exc).__name__})") from None


def _extract_members(archive: Path, into: Path, *, limit: int, label: str) -> None:
    total = 0
    with zipfile.ZipFile(archive) as zf:
        members = zf.infolist()
        if len(members) > MAX_ZIP_MEMBERS:
            raise ConnectorError(f"upload {label!r}: more than {MAX_ZIP_MEMBERS} files in the ZIP")
        for member in members:
            parts = PurePosixPath(member.filename.replace("\\", "/")).parts
            if not parts or member.filename.startswith("/") or ".." in parts or ":" in parts[0]:
                raise ConnectorError(f"upload {label!r}: the ZIP holds an unsafe path {member.filename!r}")
            if stat.S_ISLNK(member.external_attr >> 16):
                raise ConnectorError(f"upload {label!r}: the ZIP holds a link {member.filename!r}")
            destination = into.joinpath(*parts)
            if member.is_dir():
                destination.mkdir(parents=True, exist_ok=True)
                continue
            destination.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(member) as source, open(destination, "xb") as out:
                while block := source.read(1 << 20):
                    total += len(block)
                    if total > limit:
                        raise ConnectorError(f"upload {label!r}: unpacks to more than {limit} bytes")
                    out.write(block)


def _projects(tenant_id: int, project_ids: Iterable[int]) -> list[int]:
    wanted = {int(p) for p in project_ids}
    found = set(Project.objects.filter(pk__in=wanted).values_list("pk", flat=True))
    if wanted - found:
        raise ConnectorError("projects: not projects of this organization")
    return sorted(found)


def managed_source_create(
    *,
    tenant_id: int,
    kind: str,
    name: str,
    config: dict[str, Any],
    project_ids: Iterable[int] = (),
    sync_interval_minutes: int = 60,
    enabled: bool = True,
) -> DataSource:
    """Create a source for an organization admin (the rules in the module docstring), attached to
    ``project_ids``. Raises ``ConnectorError`` naming the field. Writes ``source.create``."""
    tenant = Tenant.objects.get(pk=tenant_id)
    config = _guard_retarget(kind, config, {})
    if "path" in config and config["path"]:
        config["path"] = managed_path(kind, str(config["path"]), tenant)
    name = (name or "").strip()
    if not name:
        raise ConnectorError("name: a source needs a name")
    with tenant_context(tenant_id):
        projects = _projects(tenant_id, project_ids)
        base = slugify(name)[:70] or kind
        slug, n = base, 1
        while DataSource.objects.filter(slug=slug).exists():
            n += 1
            slug = f"{base}-{n}"
        _check_local(kind, config, label=name)
        source = source_create(
            tenant_id=tenant_id,
            kind=kind,
            name=name,
            slug=slug,
            config=config,
            project_ids=projects,
            sync_interval_minutes=sync_interval_minutes,
        )
        if not enabled:
            DataSource.objects.filter(pk=source.pk).update(enabled=False)
            source.enabled = False
    return source


def _retargeted(kind: str, config: dict[str, Any], stored: dict[str, Any]) -> bool:
    """True when ``config`` points the source somewhere other than ``stored`` (any URL field)."""
    return any((config.get(f) or None) != (stored.get(f) or None) for f in URL_FIELD_NAMES)


def _guard_retarget(kind: str, config: dict[str, Any], stored: dict[str, Any]) -> dict[str, Any]:
    """``config`` as an organization admin may send it, given the ``stored`` one: the operator's
    ``allow_private_network`` is kept only while no address changed, a kept (blank) secret is
    refused once one did (it would go to the new address), and fields only the operator sets
    (``OPERATOR_FIELDS``) keep their stored value. Raises ``ConnectorError``."""
    config = {k: v for k, v in config.items() if k != ALLOW_PRIVATE_FIELD}
    for field in OPERATOR_FIELDS.get(kind, ()):
        config.pop(field, None)
        if stored.get(field) is not None:
            config[field] = stored[field]
    if not stored:
        return config
    if _retargeted(kind, config, stored):
        kept = sorted(k for k, v in config.items() if v == MASK)
        if kept:
            raise ConnectorError(
                f"{kept[0]}: the address changed, so enter the secret again (a stored one never goes to a new address)"
            )
    elif stored.get(ALLOW_PRIVATE_FIELD):
        config[ALLOW_PRIVATE_FIELD] = stored[ALLOW_PRIVATE_FIELD]
    return config


def managed_source_update(
    *,
    tenant_id: int,
    source_id: int,
    name: str,
    config: dict[str, Any],
    project_ids: Iterable[int],
    sync_interval_minutes: int,
    enabled: bool,
) -> DataSource:
    """Change a source's name, config (secrets left as ``MASK`` keep their stored value), projects,
    schedule and enabled flag, for an organization admin. Raises ``ConnectorError`` naming the
    field. Writes ``source.update`` with the names of what changed (never secret values)."""
    tenant = Tenant.objects.get(pk=tenant_id)
    with tenant_context(tenant_id):
        source = DataSource.objects.select_for_update().get(pk=source_id)
        if config.get("path") and config["path"] != source.config.get("path"):
            config["path"] = managed_path(source.kind, str(config["path"]), tenant)
        config = _guard_retarget(source.kind, config, source.config)
        merged = config_merge_secrets(kind=source.kind, old=source.config, new=config, label=source.name)
        new = build_connector(
            source.kind, merged, include=source.include, exclude=source.exclude, source_label=source.name
        ).config.model_dump()
        try:
            old = build_connector(source.kind, source.config, source_label=source.name).config.model_dump()
        except ConnectorError:  # a stored config today's rules refuse: this edit is what fixes it
            old = {}
        projects = _projects(tenant_id, project_ids)
        path_changed = merged.get("path") != source.config.get("path")
        if path_changed:
            _check_local(source.kind, merged, label=source.name)
        before = set(ProjectSource.objects.filter(source=source).values_list("project_id", flat=True))
        # Compared as the connector reads them: a default written out is no change.
        changed = sorted(k for k in set(new) | set(old) if new.get(k) != old.get(k))
        fields = {
            "name": (name or "").strip() or source.name,
            "sync_interval_minutes": int(sync_interval_minutes),
            "enabled": bool(enabled),
        }
        changed += [k for k, v in fields.items() if getattr(source, k) != v]
        for key, value in fields.items():
            setattr(source, key, value)
        replaced = str(source.config.get("path") or "") if path_changed else ""
        source.config = merged
        source.save(update_fields=["config", *fields])
        ProjectSource.objects.filter(source=source).exclude(project_id__in=projects).delete()
        for project_id in set(projects) - before:
            ProjectSource.objects.create(tenant_id=tenant_id, project_id=project_id, source=source)
        if set(projects) != before:
            changed.append("projects")
        audit_record(
            action="source.update",
            tenant_id=tenant_id,
            object_type="sources.datasource",
            object_id=source.pk,
            data={"source": source.slug, "changed": changed, "projects": projects},
        )
    if replaced and "://" not in replaced:
        upload_discard(tenant=tenant, path=replaced)  # the earlier upload, unless a source still reads it
    return source


def managed_source_delete(*, tenant_id: int, source_id: int) -> dict[str, Any]:
    """Delete a source with everything indexed from it (its rows, runs, identities and project
    links go with it), for an organization admin, and the upload it read, when it read one
    (``upload_discard``). Returns ``{"source": slug, "name", "rows"}``; writes ``source.delete``
    (with the row count) in the same transaction. Raises ``DataSource.DoesNotExist`` for a source
    of another organization (row-level security hides it)."""
    tenant = Tenant.objects.get(pk=tenant_id)
    with tenant_context(tenant_id):
        source = DataSource.objects.select_for_update().get(pk=source_id)
        summary = {"source": source.slug, "name": source.name, "rows": source.documents.count()}
        path = str(source.config.get("path") or "")
        audit_record(
            action="source.delete",
            tenant_id=tenant_id,
            object_type="sources.datasource",
            object_id=source.pk,
            data=summary,
        )
        # The rows in one statement (only rows of this source point at them, as parents): Django's
        # delete would load every row of a large source to cascade, memory growing with its size.
        with connection.cursor() as cursor:
            cursor.execute(f"DELETE FROM {Document._meta.db_table} WHERE source_id = %s", [source.pk])
        source.delete()
    if path and "://" not in path:
        upload_discard(tenant=tenant, path=path)
    return summary


def _check_local(kind: str, config: dict[str, Any], *, label: str) -> None:
    """Run the connector's check on a source reading the organization's own files (a ``path``
    that is no URL) before it is saved: a folder that is no Slack export, or a ZIP that is no ZIP,
    is refused on save as Test connection refuses it, not found at the first sync. Sources read
    over the network are not checked on save (a slow or absent server must not block it).
    Raises ``ConnectorError``."""
    path = str(config.get("path") or "")
    if not path or "://" in path or any(config.get(f) for f in URL_FIELD_NAMES if f != "path"):
        return
    _run_check(kind, config, label=label)


def _run_check(kind: str, config: dict[str, Any], *, label: str) -> ConnectionCheck:
    try:
        return build_connector(kind, config, source_label=label).check()
    except OSError as exc:  # an unreadable folder or file name the connector did not name
        raise ConnectorError(f"the source cannot be read: {type(exc).__name__}: {exc.strerror or exc}") from None
    except (RecursionError, ValueError, UnicodeError) as exc:  # a file nested or encoded past reading
        raise ConnectorError(f"a file of the source cannot be read: {type(exc).__name__}") from None


def source_check(*, tenant_id: int, kind: str, config: dict[str, Any], source_id: int | None = None) -> ConnectionCheck:
    """Test a connection without ingesting: the connector's ``check`` on ``config`` (secrets left
    as ``MASK`` are the stored source's). Raises ``ConnectorError`` with what went wrong."""
    tenant = Tenant.objects.get(pk=tenant_id)
    stored: dict[str, Any] = {}
    if source_id is not None:
        with tenant_context(tenant_id):
            stored = DataSource.objects.get(pk=source_id).config
    if config.get("path") and config["path"] != stored.get("path"):
        config = {**config, "path": managed_path(kind, str(config["path"]), tenant)}
    config = _guard_retarget(kind, config, stored)
    merged = config_merge_secrets(kind=kind, old=stored, new=config, label=kind)
    return _run_check(kind, merged, label=kind)


def project_sources_set(*, tenant_id: int, project_id: int, source_ids: Iterable[int]) -> list[int]:
    """Attach exactly ``source_ids`` (sources of the tenant) to the project; returns them sorted.
    Raises ``ConnectorError`` for an id that is not a source of this organization. Writes
    ``project.sources`` with what was attached and detached, when anything changed."""
    with tenant_context(tenant_id):
        project = Project.objects.get(pk=project_id)
        wanted = {int(s) for s in source_ids}
        found = set(DataSource.objects.filter(pk__in=wanted).values_list("pk", flat=True))
        if wanted - found:
            raise ConnectorError("sources: not data sources of this organization")
        before = set(ProjectSource.objects.filter(project=project).values_list("source_id", flat=True))
        ProjectSource.objects.filter(project=project).exclude(source_id__in=found).delete()
        for source_id in found - before:
            ProjectSource.objects.create(tenant_id=tenant_id, project=project, source_id=source_id)
        if found != before:
            audit_record(
                action="project.sources",
                tenant_id=tenant_id,
                object_type="projects.project",
                object_id=project.pk,
                data={"project": project.slug, "attached": sorted(found - before), "detached": sorted(before - found)},
            )
    return sorted(found)
