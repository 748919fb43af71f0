"""Onboarding (join or create an organization, pick the default project that scopes queries) and
each user's own API tokens."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseForbidden
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from projects.models import Tenant
from projects.selectors import (
    api_token_get_for_user,
    api_token_list_for_user,
    project_list_for_user,
    user_is_tenant_admin,
    user_tenant_id,
)
from projects.services import (
    ApiTokenError,
    ProjectNotFound,
    api_token_create,
    api_token_revoke,
    profile_set_default_project,
    project_create,
    tenant_create,
)


class OrganizationForm(forms.Form):
    name = forms.CharField(max_length=200, label="Organization name")


class ProjectForm(forms.Form):
    name = forms.CharField(max_length=200, label="New project name")


@login_required
def onboarding(request: HttpRequest) -> HttpResponse:
    """Pick (or create) the default project; users without an organization can create one."""
    tenant_id = user_tenant_id(request.user)
    if tenant_id is None:
        form = OrganizationForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            from django.utils.crypto import get_random_string
            from django.utils.text import slugify

            slug = f"{slugify(form.cleaned_data['name'])[:60] or 'org'}-{get_random_string(6).lower()}"
            tenant = tenant_create(name=form.cleaned_data["name"], slug=slug, owner=request.user)
            project = project_create(tenant_id=tenant.pk, name="Everything")
            profile_set_default_project(user=request.user, tenant_id=tenant.pk, project_id=project.pk)
            messages.success(
                request, f"Created {tenant.name} with a project “Everything”. Add data sources in the admin."
            )
            return redirect("search:ask")
        return render(request, "projects/onboarding.html", {"org_form": form, "projects": []})

    projects = project_list_for_user(request.user)
    is_admin = user_is_tenant_admin(request.user, tenant_id)
    project_form = ProjectForm(request.POST if request.POST.get("action") == "create" else None)
    if request.method == "POST":
        try:
            if request.POST.get("action") == "create":
                if not is_admin:
                    return HttpResponseForbidden("Only owners and admins of the organization create projects.")
                if project_form.is_valid():
                    project = project_create(tenant_id=tenant_id, name=project_form.cleaned_data["name"])
                    profile_set_default_project(user=request.user, tenant_id=tenant_id, project_id=project.pk)
                    return redirect("search:ask")
            else:
                by_id = {str(p.public_id): p for p in projects}
                chosen = by_id.get(request.POST.get("project", ""))
                if chosen is None:
                    raise ProjectNotFound("choose one of the listed projects")
                profile_set_default_project(user=request.user, tenant_id=tenant_id, project_id=chosen.pk)
                messages.success(request, f"Your default project is now {chosen.name}.")
                return redirect("search:ask")
        except ProjectNotFound as exc:
            messages.error(request, str(exc))
    context = {"projects": projects, "project_form": project_form if is_admin else None}
    return render(request, "projects/onboarding.html", context)


class TokenForm(forms.Form):
    name = forms.CharField(max_length=100, label="Name", help_text="What the token is for, e.g. “laptop scripts”.")
    project = forms.ChoiceField(
        required=False, label="Project", help_text="Pin the token to one project; blank follows your default project."
    )
    expires_in_days = forms.IntegerField(
        required=False, min_value=1, max_value=3650, label="Expires after (days)", help_text="Blank: never."
    )

    def __init__(self, *args, projects=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["project"].choices = [
            ("", "— my default project —"),
            *((str(p.public_id), p.name) for p in projects),
        ]


@login_required
def tokens(request: HttpRequest) -> HttpResponse:
    """The signed-in user's own API tokens: list them, create one (its secret shown once), revoke."""
    tenant_id = user_tenant_id(request.user)
    if tenant_id is None:
        return redirect("projects:onboarding")
    projects = project_list_for_user(request.user)
    form = TokenForm(request.POST or None, projects=projects)
    created = None
    if request.method == "POST" and form.is_valid():
        by_id = {str(p.public_id): p for p in projects}
        project = by_id.get(form.cleaned_data["project"] or "")
        try:
            _, created = api_token_create(
                tenant=Tenant.objects.get(pk=tenant_id),
                user=request.user,
                name=form.cleaned_data["name"],
                project=project,
                expires_in_days=form.cleaned_data["expires_in_days"],
            )
            form = TokenForm(projects=projects)
        except ApiTokenError as exc:
            form.add_error(None, str(exc))
    readable = {p.pk for p in projects}
    listed = api_token_list_for_user(user=request.user, tenant_id=tenant_id)
    # A token pinned to a project the user can no longer read names no project (the name is theirs no more).
    rows = [(t, t.project.name if t.project_id in readable and t.project else None) for t in listed]
    context = {"tokens": rows, "form": form}
    response = render(request, "projects/tokens.html", {**context, "created": created})
    if created:
        response["Cache-Control"] = "no-store"  # the secret is on this page only
    return response


@login_required
@require_POST
def token_revoke(request: HttpRequest, prefix: str) -> HttpResponse:
    """Revoke one of the signed-in user's own tokens (anyone else's: 404)."""
    tenant_id = user_tenant_id(request.user)
    token = api_token_get_for_user(user=request.user, tenant_id=tenant_id, prefix=prefix) if tenant_id else None
    if token is None:
        raise Http404("no such token")
    api_token_revoke(token=token)
    messages.success(request, f"Token “{token.name}” (kb_{token.prefix}) is revoked.")
    return redirect("projects:tokens")
