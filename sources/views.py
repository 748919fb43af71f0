"""Web views of data sources: the tenant admins' status page, "sync now", and the git push
webhook. Each parses the request, calls a selector or service (``sources.selectors``,
``sources.scheduling``, ``sources.webhooks``) and renders its answer."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import RequestDataTooBig
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from kbportal.tenancy import tenant_context
from projects.models import Membership, Project, ProjectMember, Tenant
from projects.selectors import form_int, project_default_for_user, user_is_tenant_admin, user_tenant_id
from projects.services import project_create, project_member_add, project_member_remove, project_set_visibility
from sources.connectors.base import ConnectorError
from sources.connectors.registry import connector_kinds, get_connector_class
from sources.forms import SourceForm, config_form_class
from sources.models import DataSource, ProjectSource
from sources.scheduling import source_health_list, source_sync_queue
from sources.selectors import identity_list, source_sync_allowed
from sources.services.managed import (
    managed_source_create,
    managed_source_delete,
    managed_source_update,
    project_sources_set,
    shown_path,
    shown_text,
    source_check,
    upload_discard,
    upload_store,
)
from sources.webhooks import SIGNATURE_HEADER, git_push_receive


def _admin_tenant(request: HttpRequest) -> int | None:
    """The user's tenant when they are one of its owners or admins, else ``None``."""
    tenant_id = user_tenant_id(request.user)
    if tenant_id is None or not user_is_tenant_admin(request.user, tenant_id):
        return None
    return tenant_id


def _not_found(request: HttpRequest) -> HttpResponse:
    # As /audit/: members and people of other organizations are not told the page exists.
    return render(request, "search/not_found.html", {"message": "no such page"}, status=404)


@login_required
@require_GET
def status_page(request: HttpRequest) -> HttpResponse:
    """``/sources/status/``: every data source of the tenant with its schedule and health (last
    success, lag, row count, last run's counts and error, failing/backed-off state, next run).
    Owners and admins of the tenant only (404 otherwise)."""
    tenant_id = _admin_tenant(request)
    if tenant_id is None:
        return _not_found(request)
    rows = source_health_list(tenant_id=tenant_id)
    for row in rows:  # shown, never saved: the server's folders are not the organization's to know
        row.source.last_error = shown_text(row.source.last_error or "")
    counts = {
        "total": len(rows),
        "failing": sum(1 for r in rows if r.failing),
        "late": sum(1 for r in rows if r.late and r.source.enabled),
    }
    return render(request, "sources/status.html", {"rows": rows, "counts": counts})


@login_required
@require_GET
def identities_page(request: HttpRequest) -> HttpResponse:
    """``/manage/identities/``: the people and groups the organization's data sources expose
    (Slack users, Confluence accounts and groups, ...), each identity with the member it links to
    through a verified email, unlinked ones first with the reason. Owners and admins of the
    tenant only (404 otherwise)."""
    tenant_id = _admin_tenant(request)
    if tenant_id is None:
        return _not_found(request)
    rows, groups = identity_list(tenant_id=tenant_id)
    counts = {"total": len(rows), "unlinked": sum(1 for r in rows if r.linked_to is None), "groups": len(groups)}
    return render(request, "sources/identities.html", {"rows": rows, "groups": groups, "counts": counts})


@login_required
@require_POST
def sync_now(request: HttpRequest, slug: str) -> HttpResponse:
    """``POST /sources/<slug>/sync``: queue a run of the tenant's source ``slug``, through the same
    path as the schedule, the admin and the API, for whoever may sync it there too (owners,
    admins, editors of one of its projects: ``sources.selectors.source_sync_allowed``); 404 for
    anyone else, so a source's existence is not told."""
    tenant_id = user_tenant_id(request.user)
    if tenant_id is None:
        return _not_found(request)
    with tenant_context(tenant_id, user_id=request.user.pk):
        source = DataSource.objects.filter(slug=slug).first()
    if source is None or not source_sync_allowed(user=request.user, tenant_id=tenant_id, source=source):
        return _not_found(request)
    run = source_sync_queue(
        tenant_id=tenant_id,
        source_id=source.pk,
        via="web",
        actor=request.user,
        token_prefix=None,
        user_id=request.user.pk,
    )
    messages.success(request, f"Queued run {run.pk} of {source.name}.")
    return redirect("sources:status" if _admin_tenant(request) is not None else "search:ask")


@csrf_exempt
@require_POST
def git_push_hook(request: HttpRequest, public_id: str) -> JsonResponse:
    """``POST /hooks/git/<source public id>``: a repository host's push webhook for a git source.

    The answer is :func:`sources.webhooks.git_push_receive`'s (JSON, ``{"error", "code"}`` on
    failure), or 413 ``too_large`` for a body over Django's upload limit.
    """
    try:
        body = request.body
    except RequestDataTooBig:
        return JsonResponse(
            {"error": "the request body is larger than this server accepts", "code": "too_large"}, status=413
        )
    outcome = git_push_receive(
        public_id=public_id,
        body=body,
        signature=request.headers.get(SIGNATURE_HEADER),
        event=request.headers.get("X-GitHub-Event") or request.headers.get("X-Gitea-Event"),
        form_encoded=request.content_type == "application/x-www-form-urlencoded",
    )
    return JsonResponse(outcome.body, status=outcome.status)


# ---------- /manage/sources/: the organization's data sources, for its owners and admins ----------


def _admin_tenant_or_404(request: HttpRequest) -> int:
    tenant_id = _admin_tenant(request)
    if tenant_id is None:
        raise Http404("no such page")
    return tenant_id


@login_required
@require_GET
def manage_sources(request: HttpRequest) -> HttpResponse:
    """``/manage/sources/``: the organization's data sources and the kinds one can add."""
    tenant_id = _admin_tenant_or_404(request)
    with tenant_context(tenant_id):
        sources = list(DataSource.objects.order_by("name"))
    return render(request, "sources/manage_sources.html", {"sources": sources, "kinds": sorted(connector_kinds())})


@login_required
def manage_source_new(request: HttpRequest, kind: str) -> HttpResponse:
    """``/manage/sources/new/<kind>/``: a typed form for a new source of ``kind``."""
    tenant_id = _admin_tenant_or_404(request)
    if kind not in connector_kinds():
        raise Http404("no such data source kind")
    return _source_page(request, tenant_id, kind, None)


@login_required
def manage_source_edit(request: HttpRequest, slug: str) -> HttpResponse:
    """``/manage/sources/<slug>/``: edit a source (secrets write-only), test its connection."""
    tenant_id = _admin_tenant_or_404(request)
    with tenant_context(tenant_id):
        source = DataSource.objects.filter(slug=slug).first()
        attached = [str(p) for p in ProjectSource.objects.filter(source=source).values_list("project_id", flat=True)]
    if source is None:
        raise Http404("no such data source")
    return _source_page(request, tenant_id, source.kind, source, attached)


@login_required
def manage_source_delete(request: HttpRequest, slug: str) -> HttpResponse:
    """``/manage/sources/<slug>/delete/``: GET asks to confirm (naming how many rows go), POST
    deletes the source and everything indexed from it."""
    tenant_id = _admin_tenant_or_404(request)
    with tenant_context(tenant_id):
        source = DataSource.objects.filter(slug=slug).first()
        rows = source.documents.count() if source is not None else 0
    if source is None:
        raise Http404("no such data source")
    if request.method == "POST":
        deleted = managed_source_delete(tenant_id=tenant_id, source_id=source.pk)
        messages.success(request, f"Deleted {deleted['name']} and its {deleted['rows']} indexed rows.")
        return redirect("sources:manage_sources")
    return render(request, "sources/manage_source_delete.html", {"source": source, "rows": rows})


def _source_page(
    request: HttpRequest, tenant_id: int, kind: str, source: DataSource | None, attached: list[str] | None = None
) -> HttpResponse:
    model = get_connector_class(kind).config_model
    config_form_cls = config_form_class(kind, model)
    file_based = "path" in model.model_fields
    with tenant_context(tenant_id, user_id=request.user.pk):
        projects = [(str(p.pk), p.name) for p in Project.objects.order_by("name")]
        default = project_default_for_user(user_id=request.user.pk)
    posted = request.method == "POST"
    # A new source starts in the admin's default project (else the only one there is).
    preselected = (
        [str(default.pk)] if default is not None else [p for p, _ in projects][:1] if len(projects) == 1 else []
    )
    initial = (
        {
            "name": source.name,
            "projects": attached or [],
            "sync_interval_minutes": source.sync_interval_minutes,
            "enabled": source.enabled,
        }
        if source is not None
        else {"projects": preselected}
    )
    form = SourceForm(
        request.POST if posted else None,
        request.FILES if posted else None,
        projects=projects,
        file_based=file_based,
        initial=initial,
    )
    if posted and request.POST.get("action") == "test":
        form.fields["projects"].required = False  # a test writes nothing: no project needed yet
    tenant = Tenant.objects.get(pk=tenant_id)
    stored = dict(source.config) if source is not None else None
    if stored and isinstance(stored.get("path"), str):
        stored["path"] = shown_path(stored["path"], tenant)
    config_form = config_form_cls(request.POST if posted else None, stored=stored, prefix="config")
    if "upload" in form.fields:
        # A path or an upload: the browser must not insist on the path (the model still does,
        # unless a file came with the form).
        config_form.fields["path"].required = False
        if posted and request.FILES.get("upload"):
            config_form.provided.add("path")
    check, error = None, None
    if posted and form.is_valid() and config_form.is_valid():
        config = dict(config_form.config)
        stored_upload = None
        try:
            upload = form.cleaned_data.get("upload")
            if upload is not None:
                stored_upload = upload_store(tenant=tenant, kind=kind, name=upload.name, chunks=upload.chunks())
                config["path"] = stored_upload
            if request.POST.get("action") == "test":
                check = shown_text(
                    source_check(
                        tenant_id=tenant_id, kind=kind, config=config, source_id=source.pk if source else None
                    ).summary()
                )
                if stored_upload is not None:
                    check += " The uploaded file was only tested: choose it again when you save."
            else:
                fields = {
                    "name": form.cleaned_data["name"],
                    "config": config,
                    "project_ids": [int(p) for p in form.cleaned_data["projects"]],
                    "sync_interval_minutes": form.cleaned_data["sync_interval_minutes"],
                    "enabled": form.cleaned_data["enabled"],
                }
                if source is None:
                    source = managed_source_create(tenant_id=tenant_id, kind=kind, **fields)
                    messages.success(request, f"Created {source.name}. Sync it now, or wait for its schedule.")
                else:
                    source = managed_source_update(tenant_id=tenant_id, source_id=source.pk, **fields)
                    messages.success(request, f"Saved {source.name}.")
                stored_upload = None  # kept: the saved source reads it
                return redirect("sources:manage_source", source.slug)
        except ConnectorError as exc:
            error = shown_text(str(exc))
            field = error.split(":", 1)[0].rsplit(" ", 1)[-1]
            if field in config_form.fields:
                config_form.add_error(field, error.split(":", 1)[1].strip())
                error = None
        finally:
            if stored_upload is not None:  # a test, or a save that failed: the upload is not kept
                upload_discard(tenant=tenant, path=stored_upload)
    context = {"kind": kind, "source": source, "form": form, "config_form": config_form, "check": check, "error": error}
    return render(request, "sources/manage_source.html", context)


# ---------- /manage/projects/: projects, their visibility, members and sources ----------------------


class NewProjectForm(forms.Form):
    name = forms.CharField(max_length=200)
    visibility = forms.ChoiceField(choices=Project.Visibility.choices, initial=Project.Visibility.TENANT)


@login_required
def manage_projects(request: HttpRequest) -> HttpResponse:
    """``/manage/projects/``: the organization's projects; POST creates one."""
    tenant_id = _admin_tenant_or_404(request)
    form = NewProjectForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        project = project_create(
            tenant_id=tenant_id, name=form.cleaned_data["name"], visibility=form.cleaned_data["visibility"]
        )
        messages.success(request, f"Created project {project.name}.")
        return redirect("sources:manage_project", project.slug)
    with tenant_context(tenant_id):
        projects = list(Project.objects.order_by("name"))
        counts = {p.pk: 0 for p in projects}
        for project_id in ProjectSource.objects.values_list("project_id", flat=True):
            counts[project_id] = counts.get(project_id, 0) + 1
    rows = [(p, counts.get(p.pk, 0)) for p in projects]
    return render(request, "sources/manage_projects.html", {"rows": rows, "form": form})


@login_required
def manage_project(request: HttpRequest, slug: str) -> HttpResponse:
    """``/manage/projects/<slug>/``: visibility, members (viewer/editor) and attached sources.

    POST ``action`` = ``visibility`` (visibility), ``member_add`` (user, role), ``member_remove``
    (user) or ``sources`` (source ids); each through its service, each one audit event."""
    tenant_id = _admin_tenant_or_404(request)
    with tenant_context(tenant_id):
        project = Project.objects.filter(slug=slug).first()
        if project is None:
            raise Http404("no such project")
        tenant_users = {m.user_id: m.user for m in Membership.objects.select_related("user")}
    if request.method == "POST":
        action = request.POST.get("action")
        try:
            if action == "visibility":
                project_set_visibility(project=project, visibility=request.POST.get("visibility", ""))
            elif action in ("member_add", "member_remove"):
                user = tenant_users.get(form_int(request.POST.get("user")))
                if user is None:
                    raise ValueError("no such member of this organization")
                if action == "member_add":
                    project_member_add(project=project, user=user, role=request.POST.get("role", ""))
                else:
                    project_member_remove(project=project, user=user)
            elif action == "sources":
                project_sources_set(
                    tenant_id=tenant_id,
                    project_id=project.pk,
                    source_ids=[form_int(s) for s in request.POST.getlist("sources")],
                )
            else:
                raise ValueError("unknown action")
            messages.success(request, "Saved.")
            return redirect("sources:manage_project", project.slug)
        except (ValueError, ConnectorError) as exc:
            messages.error(request, str(exc))
    with tenant_context(tenant_id):
        members = list(ProjectMember.objects.filter(project=project).select_related("user").order_by("user__username"))
        sources = list(DataSource.objects.order_by("name"))
        attached = set(ProjectSource.objects.filter(project=project).values_list("source_id", flat=True))
    in_project = {m.user_id for m in members}
    context = {
        "project": project,
        "members": members,
        "sources": [(s, s.pk in attached) for s in sources],
        "candidates": sorted((u for pk, u in tenant_users.items() if pk not in in_project), key=lambda u: u.username),
        "visibilities": Project.Visibility.choices,
        "roles": ProjectMember.Role.choices,
    }
    return render(request, "sources/manage_project.html", context)
