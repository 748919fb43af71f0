"""Onboarding (join or create an organization, pick the default project that scopes queries),
each user's own API tokens, and the organization's people at ``/manage/people/`` with the
invitation link they are sent."""

from __future__ import annotations

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import login, password_validation
from django.contrib.auth.decorators import login_required
from django.core.mail import send_mail
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseForbidden
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from kbportal.tenancy import tenant_context
from projects.models import Membership, Project, Tenant
from projects.people import (
    INVITATION_DAYS,
    PeopleError,
    invitation_accept,
    invitation_get,
    invitation_revoke,
    member_invite,
    member_remove,
    member_set_role,
    people_list,
    user_for_invitation,
)
from projects.selectors import (
    api_token_get_for_tenant,
    api_token_get_for_user,
    api_token_list_for_tenant,
    api_token_list_for_user,
    form_int,
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
                request, f"Created {tenant.name} with a project “Everything”. Add data sources under Manage."
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
                return redirect(_next(request))
        except ProjectNotFound as exc:
            messages.error(request, str(exc))
    profile = getattr(request.user, "kb_profile", None)  # none before the first choice
    current = next((p.public_id for p in projects if p.pk == getattr(profile, "default_project_id", None)), None)
    context = {
        "projects": projects,
        "project_form": project_form if is_admin else None,
        "has_default": bool(current),
        "current": current or (projects[0].public_id if projects else None),
    }
    return render(request, "projects/onboarding.html", context)


def _next(request: HttpRequest) -> str:
    """The ``next`` address of an onboarding form when it is a path of this site, else the ask page."""
    target = request.POST.get("next") or request.GET.get("next") or ""
    if target and url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}, require_https=False):
        return target
    return reverse("search:ask")


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


# ---------- /manage/: the organization's people, for its owners and admins -------------------------


def _managed_tenant(request: HttpRequest) -> int:
    """The user's tenant when they are one of its owners or admins; 404 otherwise (as /audit/:
    members and people of other organizations are not told the page exists)."""
    tenant_id = user_tenant_id(request.user)
    if tenant_id is None or not user_is_tenant_admin(request.user, tenant_id):
        raise Http404("no such page")
    return tenant_id


class InviteForm(forms.Form):
    email = forms.EmailField(label="Email address", max_length=254)
    role = forms.ChoiceField(choices=Membership.Role.choices, initial=Membership.Role.MEMBER, label="Role")
    project = forms.ChoiceField(
        required=False,
        label="Project",
        help_text="They join it as a viewer and it becomes their default project (blank: choose on first sign-in).",
    )

    def __init__(self, *args, projects: list[tuple[str, str]] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["project"].choices = [("", "—"), *(projects or [])]  # type: ignore[attr-defined]


@login_required
def manage_home(request: HttpRequest) -> HttpResponse:
    """``/manage/``: the organization's admin pages, for its owners and admins (404 otherwise)."""
    tenant_id = _managed_tenant(request)
    return render(request, "projects/manage.html", {"tenant": Tenant.objects.get(pk=tenant_id)})


@login_required
def manage_people(request: HttpRequest) -> HttpResponse:
    """``/manage/people/``: members with their roles, pending invitations, and the invite form.

    POST ``action=invite`` (email, role) creates an invitation and mails its link to the address
    (never shown here: holding the link proves the address);
    ``action=role`` (user, role), ``action=remove`` (user) and ``action=withdraw`` (invitation)
    go through :mod:`projects.people`, whose refusals are shown as errors.
    """
    tenant_id = _managed_tenant(request)
    tenant = Tenant.objects.get(pk=tenant_id)
    with tenant_context(tenant_id):
        project_choices = [(str(p.pk), p.name) for p in Project.objects.order_by("name")]
    form = InviteForm(request.POST if request.POST.get("action") == "invite" else None, projects=project_choices)
    if request.method == "POST":
        action = request.POST.get("action")
        try:
            if action == "invite":
                if form.is_valid():
                    invitation, token = member_invite(
                        tenant_id=tenant_id,
                        actor_user=request.user,
                        email=form.cleaned_data["email"],
                        role=form.cleaned_data["role"],
                        project_id=int(form.cleaned_data["project"]) if form.cleaned_data["project"] else None,
                    )
                    link = request.build_absolute_uri(reverse("projects:invitation", args=[tenant.slug, token]))
                    into = dict(project_choices).get(form.cleaned_data["project"] or "", "")
                    into = f", in the project {into}," if into else ""
                    try:
                        send_mail(
                            f"You are invited to {tenant.name} on kbportal",
                            f"{request.user.get_username()} invited you to join {tenant.name}{into} as "
                            f"{invitation.role}.\n\nOpen this link within {INVITATION_DAYS} days to join:\n{link}\n",
                            None,
                            [invitation.email],
                            fail_silently=False,
                        )
                    except Exception as exc:  # an unreachable mail server: the invitation reached nobody
                        invitation_revoke(tenant_id=tenant_id, actor_user=request.user, invitation_id=invitation.pk)
                        raise PeopleError(
                            f"the invitation could not be mailed ({type(exc).__name__}); try again"
                        ) from exc
                    # The link goes to the address only: holding it is what proves the address.
                    where = (
                        " (no mail server is configured: the message is in var/mail/ on the server)"
                        if (settings.EMAIL_BACKEND.endswith("filebased.EmailBackend"))
                        else ""
                    )
                    messages.success(
                        request, f"Invited {invitation.email} as {invitation.role}; the link was mailed{where}."
                    )
                    form = InviteForm(projects=project_choices)
            elif action in ("role", "remove"):
                user_id = _int(request.POST.get("user"))
                if action == "role":
                    member_set_role(
                        tenant_id=tenant_id, actor_user=request.user, user_id=user_id, role=request.POST.get("role", "")
                    )
                    messages.success(request, "Role changed.")
                else:
                    done = member_remove(tenant_id=tenant_id, actor_user=request.user, user_id=user_id)
                    messages.success(
                        request,
                        f"Removed; {done['tokens_revoked']} API token(s) revoked, "
                        f"{done['sessions_ended']} session(s) ended.",
                    )
                return redirect("projects:manage_people")
            elif action == "withdraw":
                invitation_revoke(
                    tenant_id=tenant_id, actor_user=request.user, invitation_id=_int(request.POST.get("invitation"))
                )
                messages.success(request, "Invitation withdrawn.")
                return redirect("projects:manage_people")
            else:
                messages.error(request, "Unknown action.")
        except PeopleError as exc:
            messages.error(request, str(exc))
    members, pending = people_list(tenant_id=tenant_id)
    context = {"tenant": tenant, "members": members, "pending": pending, "form": form, "roles": Membership.Role.choices}
    return render(request, "projects/people.html", context)


def _int(value: str | None) -> int:
    try:
        return form_int(value)
    except ValueError:
        raise PeopleError("no such member or invitation") from None


class InvitationSignupForm(forms.Form):
    username = forms.CharField(max_length=150, label="Username")
    password1 = forms.CharField(widget=forms.PasswordInput, label="Password")
    password2 = forms.CharField(widget=forms.PasswordInput, label="Password again")

    def clean(self):
        data = super().clean()
        if data.get("password1") != data.get("password2"):
            raise forms.ValidationError("The two passwords differ.")
        if data.get("password1"):
            password_validation.validate_password(data["password1"])
        return data


def invitation(request: HttpRequest, tenant_slug: str, token: str) -> HttpResponse:
    """``/invite/<tenant slug>/<token>/``: accept an invitation. Signed in (with the invited
    address verified): one button. Anonymous: create an account for the invited address, or sign
    in first. An invalid, used or expired link: 404 with the reason."""
    try:
        found = invitation_get(tenant_slug=tenant_slug, token=token)
    except PeopleError as exc:
        return render(request, "search/not_found.html", {"message": str(exc)}, status=404)
    tenant = Tenant.objects.get(pk=found.tenant_id)
    form = InvitationSignupForm(request.POST or None) if not request.user.is_authenticated else None
    error = None
    if request.method == "POST":
        try:
            if request.user.is_authenticated:
                invitation_accept(tenant_slug=tenant_slug, token=token, user=request.user)
            elif form is not None and form.is_valid():
                with transaction.atomic():
                    user = user_for_invitation(
                        username=form.cleaned_data["username"],
                        password=form.cleaned_data["password1"],
                        email=found.email,
                    )
                    invitation_accept(tenant_slug=tenant_slug, token=token, user=user, new_account=True)
                login(request, user, backend="django.contrib.auth.backends.ModelBackend")
            else:
                raise PeopleError("")
            messages.success(request, f"Welcome to {tenant.name}. Pick your default project if you like.")
            return redirect("projects:onboarding")
        except PeopleError as exc:
            error = str(exc) or None
    context = {"tenant": tenant, "invitation": found, "form": form, "error": error}
    response = render(request, "projects/invitation.html", context)
    response["Cache-Control"] = "no-store"
    # The token is in this page's address: no referrer leaves the site. ("no-referrer" would make
    # the browser post the form with Origin: null, which CSRF protection rightly refuses.)
    response["Referrer-Policy"] = "same-origin"
    return response


class ServiceTokenForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="What the token is for, e.g. “nightly report job”.")
    project = forms.ChoiceField(label="Project", help_text="A service token acts for no person, within one project.")
    expires_in_days = forms.IntegerField(
        required=False, min_value=1, max_value=3650, label="Expires after (days)", help_text="Blank: never."
    )

    def __init__(self, *args, projects=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["project"].choices = [(str(p.public_id), p.name) for p in projects]


@login_required
def manage_tokens(request: HttpRequest) -> HttpResponse:
    """``/manage/tokens/``: every API token of the organization (people's and service tokens):
    revoke any (POST ``revoke``=prefix), create a service token (its secret shown once)."""
    tenant_id = _managed_tenant(request)
    tenant = Tenant.objects.get(pk=tenant_id)
    with tenant_context(tenant_id):
        projects = list(Project.objects.order_by("name"))
    form = ServiceTokenForm(request.POST if request.POST.get("action") == "create" else None, projects=projects)
    created = None
    if request.method == "POST":
        if request.POST.get("action") == "revoke":
            token = api_token_get_for_tenant(tenant_id=tenant_id, prefix=request.POST.get("prefix", ""))
            if token is None:
                raise Http404("no such token")
            api_token_revoke(token=token)
            messages.success(request, f"Token “{token.name}” (kb_{token.prefix}) is revoked.")
            return redirect("projects:manage_tokens")
        if form.is_valid():
            project = next(p for p in projects if str(p.public_id) == form.cleaned_data["project"])
            try:
                _, created = api_token_create(
                    tenant=tenant,
                    user=None,
                    name=form.cleaned_data["name"],
                    project=project,
                    expires_in_days=form.cleaned_data["expires_in_days"],
                )
                form = ServiceTokenForm(projects=projects)
            except ApiTokenError as exc:
                form.add_error(None, str(exc))
    context = {"tokens": api_token_list_for_tenant(tenant_id=tenant_id), "form": form, "created": created}
    response = render(request, "projects/manage_tokens.html", context)
    if created:
        response["Cache-Control"] = "no-store"  # the secret is on this page only
    return response


@login_required
def manage_sso(request: HttpRequest) -> HttpResponse:
    """``/manage/sso/``: the organization's single sign-on providers with their email domains and
    the role of new members (read-only: the operator adds them, see the page)."""
    from kbportal.models import TenantIdentityProvider

    tenant_id = _managed_tenant(request)
    with tenant_context(tenant_id):
        providers = list(TenantIdentityProvider.objects.select_related("social_app").order_by("social_app__name"))
    return render(request, "projects/manage_sso.html", {"providers": providers})
