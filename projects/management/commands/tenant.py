"""``manage.py tenant add|list``: the operator's organization commands.

``add --name NAME --owner-email ADDRESS [--slug SLUG] [--base-url URL]`` creates the organization
with a project "Everything" and invites ADDRESS as its owner: the link is mailed (``KB_EMAIL_HOST``,
else a file under ``var/mail/``) and printed for the operator, who may pass it on. From there the
owner runs the organization at ``/manage/`` (README: "Running your organization").
"""

from __future__ import annotations

from django.conf import settings
from django.core.mail import send_mail
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from django.urls import reverse
from django.utils.text import slugify

from projects.models import Tenant
from projects.people import INVITATION_DAYS, PeopleError, operator_invite
from projects.services import project_create, tenant_create


class Command(BaseCommand):
    help = "Create an organization and invite its first owner, or list organizations."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        add = sub.add_parser("add", help="create an organization and invite its owner")
        add.add_argument("--name", required=True)
        add.add_argument("--owner-email", required=True)
        add.add_argument("--slug", default=None)
        add.add_argument(
            "--base-url",
            default=None,
            help="the portal's address, for the link (default: KB_PUBLIC_URL, else http://127.0.0.1:8000)",
        )
        sub.add_parser("list", help="list organizations")

    def handle(self, *args, **options):
        if options["action"] == "list":
            for tenant in Tenant.objects.order_by("slug"):
                self.stdout.write(f"{tenant.slug}\t{tenant.name}")
            return
        name = options["name"].strip()
        slug = options["slug"] or slugify(name)[:60]
        if not name or not slug or slug != slugify(slug)[:60]:
            raise CommandError("--name must hold letters or digits; --slug lower-case letters, digits and -")
        if Tenant.objects.filter(slug=slug).exists():
            raise CommandError(f"an organization with slug {slug!r} exists; pass another --slug")
        try:
            with transaction.atomic():  # all or nothing: no organization without its owner invitation
                tenant = tenant_create(name=name, slug=slug)
                project_create(tenant_id=tenant.pk, name="Everything")
                invitation, token = operator_invite(tenant_id=tenant.pk, email=options["owner_email"])
        except PeopleError as exc:
            raise CommandError(f"--owner-email: {exc}") from exc
        base_url = options["base_url"] or settings.KB_PUBLIC_URL or "http://127.0.0.1:8000"
        link = base_url.rstrip("/") + reverse("projects:invitation", args=[tenant.slug, token])
        send_mail(
            f"You are invited to run {tenant.name} on kbportal",
            f"Open this link within {INVITATION_DAYS} days to become the owner of {tenant.name}:\n{link}\n",
            None,
            [invitation.email],
            fail_silently=True,
        )
        where = "var/mail/" if settings.EMAIL_BACKEND.endswith("filebased.EmailBackend") else invitation.email
        self.stdout.write(f"Created {tenant.name} ({tenant.slug}) with the project Everything.")
        self.stdout.write(f"Owner invitation for {invitation.email} (mailed to {where}):\n{link}")
