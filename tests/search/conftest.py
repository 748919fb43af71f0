"""A small committed knowledge base in two tenants, shared by the search and ask tests.

Committed (not inside a test transaction) so the executor's tool threads, which open their
own database connections, see it too. Each tenant's slug is unique to this fixture.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from django.contrib.auth import get_user_model
from django.test import override_settings

CUSTOM = {"test_rows": "tests.search.rows_connector.RowsConnector"}

ACME_ROWS = [
    {
        "external_id": "runbook#deploy",
        "kind": "doc_section",
        "title": "Runbook > Deploying the billing service",
        "path": "runbook.md",
        "url": "https://wiki.acme.example/runbook#deploy",
        "content": "To deploy the billing service run `make release` from the ops repository. "
        "The deploy pipeline needs the BILLING_DEPLOY_TOKEN secret. Rollbacks use `make rollback`.",
    },
    {
        "external_id": "runbook#oncall",
        "kind": "doc_section",
        "title": "Runbook > On-call rotation",
        "path": "runbook.md",
        "url": "https://wiki.acme.example/runbook#oncall",
        "content": "The on-call engineer is paged through PagerDuty. Escalate to the platform team after "
        "thirty minutes without acknowledgement.",
    },
    {
        "external_id": "handbook#vacation",
        "kind": "doc_section",
        "title": "Handbook > Vacation policy",
        "path": "handbook.md",
        "url": "https://wiki.acme.example/handbook#vacation",
        "content": "Employees get twenty-five days of paid vacation per year. Request time off in the HR "
        "portal at least two weeks ahead.",
    },
    {
        "external_id": "billing/retry.py#compute_backoff",
        "kind": "code_chunk",
        "title": "billing/retry.py: compute_backoff",
        "path": "billing/retry.py",
        "start_line": 10,
        "end_line": 24,
        "url": "billing/retry.py#L10-L24",
        "content": "def compute_backoff(attempt: int) -> float:\n"
        '    """Exponential backoff with jitter for failed invoice webhooks."""\n'
        "    return min(300.0, 2 ** attempt + random.random())\n",
        "metadata": {"symbol": "compute_backoff", "language": "python"},
    },
    {
        "external_id": "C1:1700000000.000100",
        "kind": "thread",
        "title": "#billing: invoices stuck in pending",
        "url": "https://acme.slack.com/archives/C1/p1700000000000100",
        "content": "2023-11-14 22:13 Dana: invoices are stuck in pending since the webhook outage\n"
        "2023-11-14 22:20 Lee: re-run the reconciliation job with `billing reconcile --since 2d`, that fixed it",
        "metadata": {"channel": "billing", "participants": ["Dana", "Lee"]},
    },
]


def scored_verdict(question: str, evidence: list, *, status: str = "answered"):
    """A gate verdict over ``evidence`` with its passages scored by term coverage alone (no
    embedding, a corpus of 100 rows holding no question term): for tests of the synthesizer.
    Needs the database (PostgreSQL's English lexemes)."""
    from search.pipeline.gate import Verdict
    from search.pipeline.passages import score_evidence

    scored = score_evidence(question, evidence, df={}, n_rows=100)
    return Verdict(status=status, scored=scored)


@dataclass
class KB:
    acme: object
    globex: object
    acme_source_id: int
    private_marker: str
    acme_member: object


@pytest.fixture(scope="session")
def kb(django_db_setup, django_db_blocker) -> KB:
    from projects.models import Membership
    from projects.services import membership_create, profile_set_default_project, tenant_onboard
    from sources.services import source_create, source_ingest

    with django_db_blocker.unblock(), override_settings(KB_CUSTOM_CONNECTORS=CUSTOM):
        acme = tenant_onboard(name="Acme", slug="kb-acme", admin_username="kb-acme-admin", admin_password="x" * 12)
        globex = tenant_onboard(
            name="Globex", slug="kb-globex", admin_username="kb-globex-admin", admin_password="y" * 12
        )
        member = get_user_model().objects.create_user("kb-acme-member", "member@acme.example", "z" * 12)
        membership_create(tenant_id=acme.tenant.pk, user=member, role=Membership.Role.MEMBER)
        profile_set_default_project(user=member, tenant_id=acme.tenant.pk, project_id=acme.project.pk)
        private_marker = "quokka salary bands for staff engineers"
        rows = ACME_ROWS + [
            {
                "external_id": "hr#salaries",
                "kind": "doc_section",
                "title": "HR > Salary bands (restricted)",
                "path": "hr.md",
                "url": "https://wiki.acme.example/hr#salaries",
                "content": f"Restricted page: {private_marker}.",
                "principals": [f"user:{acme.admin.pk}"],
            }
        ]
        source = source_create(
            tenant_id=acme.tenant.pk,
            kind="test_rows",
            name="Acme wiki",
            config={"rows": rows},
            project_ids=[acme.project.pk],
        )
        run = source_ingest(tenant_id=acme.tenant.pk, source_id=source.pk)
        assert run.status == "succeeded", run.error
        g_source = source_create(
            tenant_id=globex.tenant.pk,
            kind="test_rows",
            name="Globex wiki",
            config={
                "rows": [
                    {
                        "external_id": "secret#zebra",
                        "kind": "doc_section",
                        "title": "Deploying the billing service at Globex",
                        "path": "globex.md",
                        "content": "Globex deploys billing with the zebra protocol: run `make release` twice.",
                    }
                ]
            },
            project_ids=[globex.project.pk],
        )
        run = source_ingest(tenant_id=globex.tenant.pk, source_id=g_source.pk)
        assert run.status == "succeeded", run.error
    return KB(acme=acme, globex=globex, acme_source_id=source.pk, private_marker=private_marker, acme_member=member)
