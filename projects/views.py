"""Onboarding: join or create an organization, then pick the default project that scopes queries."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseForbidden
from django.shortcuts import redirect, render

from projects.selectors import project_list_for_user, user_is_tenant_admin, user_tenant_id
from projects.services import ProjectNotFound, profile_set_default_project, project_create, tenant_create


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
