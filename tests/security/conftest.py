"""Attack fixtures: two committed tenants with restricted, hostile and secret rows.

Slugs are unique to this directory (atk-a / atk-b) so the suite can run beside tests/search.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from django.contrib.auth import get_user_model
from django.test import override_settings

CUSTOM = {"test_rows": "tests.search.rows_connector.RowsConnector"}

B_MARKER = "capybara zebra protocol"
ADMIN_ONLY_MARKER = "wombat payroll ledger"
CFO_MARKER = "narwhal acquisition memo"
CFO_EMAIL = "cfo@atk-a.example"
PROJ_ONLY_MARKER = "ocelot reorganisation plan"


@dataclass
class ATK:
    a: object
    b: object
    a_member: object
    a_source_id: int
    b_source_id: int
    hr_project: object
    hr_source_id: int


@pytest.fixture(scope="session")
def atk(django_db_setup, django_db_blocker) -> ATK:
    from projects.models import Membership
    from projects.services import membership_create, profile_set_default_project, project_create, tenant_onboard
    from sources.services import source_create, source_ingest

    User = get_user_model()
    with django_db_blocker.unblock(), override_settings(KB_CUSTOM_CONNECTORS=CUSTOM):
        a = tenant_onboard(name="AtkA", slug="atk-a", admin_username="atk-a-admin", admin_password="x" * 12)
        b = tenant_onboard(name="AtkB", slug="atk-b", admin_username="atk-b-admin", admin_password="y" * 12)
        member = User.objects.create_user("atk-a-member", "member@atk-a.example", "z" * 12)
        membership_create(tenant_id=a.tenant.pk, user=member, role=Membership.Role.MEMBER)
        profile_set_default_project(user=member, tenant_id=a.tenant.pk, project_id=a.project.pk)
        rows = [
            {
                "external_id": "runbook#deploy",
                "kind": "doc_section",
                "title": "Runbook > Deploying the billing service",
                "path": "runbook.md",
                "url": "https://wiki.atk-a.example/runbook#deploy",
                "content": "To deploy the billing service run make release from the ops repository.",
            },
            {
                "external_id": "hr#payroll",
                "kind": "doc_section",
                "title": "HR > Payroll (admin only)",
                "path": "hr.md",
                "url": "https://wiki.atk-a.example/hr#payroll",
                "content": f"Restricted: the {ADMIN_ONLY_MARKER} lives in the finance vault.",
                "principals": [f"user:{a.admin.pk}"],
            },
            {
                "external_id": "board#cfo",
                "kind": "doc_section",
                "title": "Board > CFO notes",
                "path": "board.md",
                "url": "https://wiki.atk-a.example/board#cfo",
                "content": f"Restricted to the CFO: the {CFO_MARKER} is due next quarter.",
                "principals": [f"email:{CFO_EMAIL}"],
            },
            {
                "external_id": "evil#1",
                "kind": "doc_section",
                "title": "<script>alert('title')</script> xylophone launch checklist",
                "path": "evil.md",
                "url": "javascript:alert(document.cookie)",
                "content": "The xylophone launch checklist: <img src=x onerror=alert('content')> "
                "verify the xylophone launch steps with the release captain before launch.",
            },
        ]
        source = source_create(
            tenant_id=a.tenant.pk,
            kind="test_rows",
            name="AtkA wiki",
            config={"rows": rows},
            project_ids=[a.project.pk],
        )
        assert source_ingest(tenant_id=a.tenant.pk, source_id=source.pk).status == "succeeded"

        # A second project with its own source (project-level membership comes with SSO/roles).
        hr_project = project_create(tenant_id=a.tenant.pk, name="HR only")
        hr_source = source_create(
            tenant_id=a.tenant.pk,
            kind="test_rows",
            name="HR private",
            config={
                "rows": [
                    {
                        "external_id": "reorg",
                        "kind": "doc_section",
                        "title": "Reorg",
                        "path": "reorg.md",
                        "content": f"Confidential: the {PROJ_ONLY_MARKER} lays off the platform team.",
                    }
                ]
            },
            project_ids=[hr_project.pk],
        )
        assert source_ingest(tenant_id=a.tenant.pk, source_id=hr_source.pk).status == "succeeded"

        b_source = source_create(
            tenant_id=b.tenant.pk,
            kind="test_rows",
            name="AtkB wiki",
            config={
                "rows": [
                    {
                        "external_id": "secret#zebra",
                        "kind": "doc_section",
                        "title": "Deploying the billing service at AtkB",
                        "path": "b.md",
                        "url": "https://wiki.atk-b.example/secret",
                        "content": f"AtkB deploys billing with the {B_MARKER}: run make release twice.",
                    }
                ]
            },
            project_ids=[b.project.pk],
        )
        assert source_ingest(tenant_id=b.tenant.pk, source_id=b_source.pk).status == "succeeded"
    return ATK(
        a=a,
        b=b,
        a_member=member,
        a_source_id=source.pk,
        b_source_id=b_source.pk,
        hr_project=hr_project,
        hr_source_id=hr_source.pk,
    )
