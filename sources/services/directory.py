"""The people and groups data sources expose (``ExternalIdentity``, ``ExternalGroup``), written
after each run from what the connector saw (``sources.connectors.base.Directory``).

Who may read what is decided elsewhere (``sources.selectors.user_principals`` turns a portal
user's verified addresses into the principals these rows name); this module only stores them.
"""

from __future__ import annotations

from kbportal.tenancy import TenantContextMissing, current_tenant_id
from sources.connectors.base import Directory
from sources.models import ExternalGroup, ExternalIdentity

# Rows per INSERT ... ON CONFLICT statement: bounds one statement's size for a large workspace.
_WRITE_BATCH = 1000


def source_directory_store(*, source_id: int, directory: Directory, replace: bool) -> dict[str, int]:
    """Upsert the people and groups ``directory`` holds for the data source ``source_id``.

    ``replace`` (a full run): the source's identities and groups the run did not see are deleted,
    and every group's member list is the run's, so a person removed from a channel's group or a
    Confluence group loses it at this sync. Without ``replace`` (an incremental run, a live
    update) nothing is deleted and member lists are replaced only for the groups seen. Must run
    inside the source's ``tenant_context`` (row-level security). Returns ``{"identities": n,
    "groups": n, "deleted": n}``.
    """
    tenant_id = current_tenant_id()
    if tenant_id is None:
        raise TenantContextMissing("source_directory_store() runs inside tenant_context()")
    people = [
        ExternalIdentity(
            tenant_id=tenant_id, source_id=source_id, principal=p.principal[:255], email=p.email, display_name=p.name
        )
        for p in directory.people.values()
    ]
    groups = [
        ExternalGroup(
            tenant_id=tenant_id,
            source_id=source_id,
            principal=g.principal[:255],
            name=g.name,
            members=sorted(g.members),
        )
        for g in directory.groups.values()
    ]
    for model, objects, fields in (
        (ExternalIdentity, people, ["email", "display_name", "updated_at"]),
        (ExternalGroup, groups, ["name", "members", "updated_at"]),
    ):
        for start in range(0, len(objects), _WRITE_BATCH):
            model.objects.bulk_create(  # type: ignore[attr-defined]
                objects[start : start + _WRITE_BATCH],
                update_conflicts=True,
                unique_fields=["source", "principal"],
                update_fields=fields,
            )
    deleted = 0
    if replace:
        deleted += (
            ExternalIdentity.objects.filter(source_id=source_id)
            .exclude(principal__in=[p.principal for p in people])
            .delete()[0]
        )
        deleted += (
            ExternalGroup.objects.filter(source_id=source_id)
            .exclude(principal__in=[g.principal for g in groups])
            .delete()[0]
        )
    return {"identities": len(people), "groups": len(groups), "deleted": deleted}
