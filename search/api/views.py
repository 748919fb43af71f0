"""The ``/api/v1/`` endpoints: thin views over the services, tools and selectors.

Each view validates its input with a request serializer (400 naming the field), resolves the
caller's scope (404 for a project, source or answer the caller may not see, whichever tenant
it is in), calls one service or selector, and returns JSON. Errors are JSON too
(``search.api.errors``). Authentication: bearer API token or browser session (CSRF enforced);
throttles per token or user (``search.api.throttling``).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from django.http import StreamingHttpResponse
from drf_spectacular.utils import OpenApiExample, OpenApiResponse, extend_schema
from rest_framework import exceptions, status
from rest_framework.permissions import IsAuthenticated
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import Serializer
from rest_framework.views import APIView

from projects.selectors import ScopeNotFound
from search.api import serializers as s
from search.api.authentication import ApiCaller, api_caller
from search.api.errors import FieldNotFound, field_error, request_id
from search.api.selectors import (
    AnalyticsForbidden,
    analytics_for_caller,
    answer_asked_by_caller,
    caller_scope,
    ingestion_run_list_for_caller,
    project_list_for_caller,
    source_list_for_caller,
)
from search.api.services import SyncForbidden, source_sync_request
from search.api.throttling import ApiThrottle, AskThrottle
from search.conversations import (
    ConversationNotFound,
    conversation_delete,
    conversation_get_for_user,
    conversation_list_for_user,
)
from search.retrieval import InvalidQuery
from search.services import (
    AnswerNotFound,
    answer_feedback_submit,
    ask,
    ask_stream,
    evidence_search,
    experts_find,
)
from search.sse import server_sent_events
from sources.selectors import QueryScope, SourceNotFound

_ERROR_TEXT = {
    400: "Invalid input; `error` and `field` name it.",
    401: "No credentials, or the API token was refused (`reason` says why).",
    403: "Not allowed (a member syncing or reading analytics, a service token voting), or a session request "
    "without its CSRF token.",
    404: "No such project, data source or answer that you may see.",
    429: "Too many requests for this token or user; retry after `Retry-After` seconds.",
}


def _errors(*codes: int, media_type: str | None = None) -> dict[Any, OpenApiResponse]:
    return {
        ((code, media_type) if media_type else code): OpenApiResponse(s.ErrorSerializer, description=_ERROR_TEXT[code])
        for code in codes
    }


def _valid(serializer_class: type[Serializer], data: Any) -> dict[str, Any]:
    """The validated data, or a 400 naming the first invalid field."""
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


def _scope(caller: ApiCaller, project: str | None) -> QueryScope:
    try:
        return caller_scope(caller, project)
    except ScopeNotFound as exc:
        raise FieldNotFound(str(exc), field="project") from exc


class EventStreamRenderer(BaseRenderer):
    """Lets ``Accept: text/event-stream`` through content negotiation; the ask view then streams.

    Never renders an error: the exception handler renders those as JSON.
    """

    media_type = "text/event-stream"
    format = "event-stream"
    charset = "utf-8"

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        return json.dumps(data, default=str).encode()


class ApiView(APIView):
    """Base of the API's views: authenticated callers only (401 otherwise), JSON, throttled."""

    permission_classes = [IsAuthenticated]
    throttle_classes = [ApiThrottle]
    renderer_classes = [JSONRenderer]

    def finalize_response(self, request: Request, response, *args, **kwargs):
        response = super().finalize_response(request, response, *args, **kwargs)
        response.setdefault("X-Request-ID", request_id(request))  # errors carry theirs already
        return response


class AskView(ApiView):
    """``POST /api/v1/ask``: the cited answer as JSON, or as server-sent events."""

    throttle_classes = [AskThrottle]
    renderer_classes = [JSONRenderer, EventStreamRenderer]

    @extend_schema(
        operation_id="ask",
        tags=["answers"],
        summary="Answer a question with [n] citations",
        description="Runs the planner, the tools and the synthesizer over the project's sources. "
        "With `?stream=1` or `Accept: text/event-stream` the answer arrives as server-sent events "
        "(`plan`, `tools`, `evidence`, `token`..., `done`; `failed` if it breaks midway), as on the ask page.",
        request=s.AskRequestSerializer,
        parameters=[s.AskQuerySerializer],
        responses={
            (200, "application/json"): s.AskResultSerializer,
            (200, "text/event-stream"): OpenApiResponse(
                s.AskEventSerializer, description="Server-sent events: `event: <type>` and `data: <JSON>` per event."
            ),
            **_errors(400, 401, 403, 404, 429, media_type="application/json"),
        },
        examples=[
            OpenApiExample("question", value={"question": "How do I deploy the billing service?"}, request_only=True)
        ],
    )
    def post(self, request: Request) -> Response | StreamingHttpResponse:
        body = _valid(s.AskRequestSerializer, request.data)
        stream = _valid(s.AskQuerySerializer, request.query_params)["stream"]
        stream = stream or isinstance(request.accepted_renderer, EventStreamRenderer)
        scope = _scope(api_caller(request), body.get("project"))
        conversation_id = body.get("conversation_id")
        try:
            if stream:
                events = ask_stream(body["question"], scope, conversation_id=conversation_id, start_conversation=True)
            else:
                result = ask(body["question"], scope, conversation_id=conversation_id, start_conversation=True)
                return Response(result.as_dict())
        except InvalidQuery as exc:
            raise field_error("question", str(exc)) from exc
        except ConversationNotFound as exc:
            raise FieldNotFound(
                f"no conversation {body.get('conversation_id')} of yours", field="conversation_id"
            ) from exc
        response = StreamingHttpResponse(server_sent_events(events), content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"  # nginx: pass each event through at once
        return response


class SearchView(ApiView):
    """``GET /api/v1/search``: ranked evidence rows, best first."""

    @extend_schema(
        operation_id="search",
        tags=["search"],
        summary="Ranked hits of the hybrid (full-text + semantic) search",
        parameters=[s.SearchQuerySerializer],
        responses={200: s.SearchResultSerializer, **_errors(400, 401, 404, 429)},
    )
    def get(self, request: Request) -> Response:
        params = _valid(s.SearchQuerySerializer, request.query_params)
        scope = _scope(api_caller(request), params.get("project"))
        kinds = sorted(params.get("kind") or ()) or None
        try:
            evidence = evidence_search(scope=scope, query=params["q"], limit=params["limit"], kinds=kinds)
        except InvalidQuery as exc:
            raise field_error("q", str(exc)) from exc
        return Response(
            {"project": scope.project_slug, "query": params["q"], "hits": [ev.as_dict() for ev in evidence]}
        )


class WhoKnowsView(ApiView):
    """``GET /api/v1/who-knows``: people ranked by their part in the best evidence."""

    @extend_schema(
        operation_id="who_knows",
        tags=["search"],
        summary="People who know about a topic, with the documents behind their score",
        parameters=[s.WhoKnowsQuerySerializer],
        responses={200: s.WhoKnowsResultSerializer, **_errors(400, 401, 404, 429)},
    )
    def get(self, request: Request) -> Response:
        params = _valid(s.WhoKnowsQuerySerializer, request.query_params)
        scope = _scope(api_caller(request), params.get("project"))
        try:
            experts = experts_find(scope=scope, query=params["q"], limit=params["limit"])
        except InvalidQuery as exc:
            raise field_error("q", str(exc)) from exc
        return Response(
            {"project": scope.project_slug, "query": params["q"], "experts": [e.as_dict() for e in experts]}
        )


class ProjectListView(ApiView):
    """``GET /api/v1/projects``: the projects the caller may query."""

    @extend_schema(
        operation_id="projects_list",
        tags=["projects"],
        summary="The projects you may query",
        responses={200: s.ProjectListSerializer, **_errors(401, 429)},
    )
    def get(self, request: Request) -> Response:
        return Response(s.ProjectListSerializer({"projects": project_list_for_caller(api_caller(request))}).data)


class SourceListView(ApiView):
    """``GET /api/v1/sources``: data sources in the caller's projects with their latest run."""

    @extend_schema(
        operation_id="sources_list",
        tags=["sources"],
        summary="Data sources in your projects, with their latest run",
        parameters=[s.SourcesQuerySerializer],
        responses={200: s.SourceListSerializer, **_errors(400, 401, 404, 429)},
    )
    def get(self, request: Request) -> Response:
        params = _valid(s.SourcesQuerySerializer, request.query_params)
        try:
            sources = source_list_for_caller(api_caller(request), project_slug=params.get("project"))
        except ScopeNotFound as exc:
            raise FieldNotFound(str(exc), field="project") from exc
        return Response(s.SourceListSerializer({"sources": sources}).data)


class SourceSyncView(ApiView):
    """``POST /api/v1/sources/<slug>/sync``: queue an ingestion run (``source_sync_allowed``: the
    organization's owners and admins, or an editor of a project the source is attached to)."""

    @extend_schema(
        operation_id="source_sync",
        tags=["sources"],
        summary="Queue an ingestion run now (owners and admins of the organization, editors of its projects)",
        request=None,
        responses={202: s.SyncQueuedSerializer, **_errors(401, 403, 404, 429)},
    )
    def post(self, request: Request, slug: str) -> Response:
        try:
            run = source_sync_request(actor=api_caller(request), source_slug=slug)
        except SourceNotFound as exc:
            raise FieldNotFound(str(exc), field="slug") from exc
        except SyncForbidden as exc:
            raise exceptions.PermissionDenied(str(exc)) from exc
        return Response(
            s.SyncQueuedSerializer({"run_id": run.pk, "source": slug, "status": run.status}).data,
            status=status.HTTP_202_ACCEPTED,
        )


class RunListView(ApiView):
    """``GET /api/v1/runs``: ingestion runs with status, counts and error text."""

    @extend_schema(
        operation_id="runs_list",
        tags=["sources"],
        summary="Ingestion runs of the data sources in your projects, newest first",
        parameters=[s.RunsQuerySerializer],
        responses={200: s.RunListSerializer, **_errors(400, 401, 404, 429)},
    )
    def get(self, request: Request) -> Response:
        params = _valid(s.RunsQuerySerializer, request.query_params)
        try:
            runs = ingestion_run_list_for_caller(
                api_caller(request), source_slug=params.get("source"), limit=params["limit"]
            )
        except SourceNotFound as exc:
            raise FieldNotFound(str(exc), field="source") from exc
        return Response(s.RunListSerializer({"runs": runs}).data)


class AnswerFeedbackView(ApiView):
    """``POST /api/v1/answers/<uuid>/feedback``: the asker's vote and comment on an answer."""

    @extend_schema(
        operation_id="answer_feedback",
        tags=["answers"],
        summary="Vote on an answer you asked (1 helpful, -1 not); voting again replaces the vote",
        request=s.FeedbackRequestSerializer,
        responses={200: s.FeedbackSerializer, **_errors(400, 401, 403, 404, 429)},
    )
    def post(self, request: Request, answer_id: uuid.UUID) -> Response:
        body = _valid(s.FeedbackRequestSerializer, request.data)
        caller = api_caller(request)
        if caller.user_id is None:
            raise exceptions.PermissionDenied("a service token has no person to vote as; use a personal token")
        not_found = FieldNotFound(f"no answer {answer_id} asked by you", field="answer_id")
        # The answer must be the caller's in the caller's tenant: a token for tenant A never
        # reaches an answer its user asked in tenant B.
        if not answer_asked_by_caller(caller, answer_id=answer_id):
            raise not_found
        try:
            feedback = answer_feedback_submit(
                actor=caller.user, answer_id=answer_id, vote=body["vote"], comment=body["comment"]
            )
        except AnswerNotFound as exc:
            raise not_found from exc
        return Response(
            s.FeedbackSerializer({"answer_id": answer_id, "vote": feedback.vote, "comment": feedback.comment}).data
        )


def _conversation_caller(request: Request) -> tuple[ApiCaller, int | None]:
    """The caller and, for a token pinned to a project, that project's id (its conversations
    only; 404 when the token's user may no longer read it). 403 for a service token."""
    caller = api_caller(request)
    if caller.user is None:
        raise exceptions.PermissionDenied("a service token holds no conversations; use a personal token")
    if caller.identity is not None and caller.identity.project_pinned:
        return caller, _scope(caller, None).project_id
    return caller, None


class ConversationListView(ApiView):
    """``GET /api/v1/conversations``: the caller's conversations in the token's organization."""

    @extend_schema(
        operation_id="conversations",
        tags=["answers"],
        summary="Your conversations, most recently active first",
        responses={200: s.ConversationListSerializer, **_errors(401, 403, 429)},
    )
    def get(self, request: Request) -> Response:
        caller, project_id = _conversation_caller(request)
        listing = (
            conversation_list_for_user(caller.user, tenant_id=caller.tenant_id, project_id=project_id)
            if caller.tenant_id
            else []
        )
        return Response({"conversations": [c.as_dict() for c in listing]})


class ConversationDetailView(ApiView):
    """``GET``/``DELETE /api/v1/conversations/<uuid>``: one of the caller's conversations."""

    def _not_found(self, conversation_id: uuid.UUID) -> FieldNotFound:
        return FieldNotFound(f"no conversation {conversation_id} of yours", field="conversation_id")

    @extend_schema(
        operation_id="conversation",
        tags=["answers"],
        summary="One of your conversations with its turns",
        responses={200: s.ConversationDetailSerializer, **_errors(401, 403, 404, 429)},
    )
    def get(self, request: Request, conversation_id: uuid.UUID) -> Response:
        caller, project_id = _conversation_caller(request)
        try:
            listing, turns = conversation_get_for_user(
                caller.user, conversation_id, tenant_id=caller.tenant_id, project_id=project_id
            )
        except ConversationNotFound as exc:
            raise self._not_found(conversation_id) from exc
        return Response({"conversation": listing.as_dict(), "turns": [t.as_dict() for t in turns]})

    @extend_schema(
        operation_id="conversation_delete",
        tags=["answers"],
        summary="Delete one of your conversations (its answers stay in analytics and the audit log)",
        responses={204: None, **_errors(401, 403, 404, 429)},
    )
    def delete(self, request: Request, conversation_id: uuid.UUID) -> Response:
        caller, project_id = _conversation_caller(request)
        try:
            conversation_delete(caller.user, conversation_id, tenant_id=caller.tenant_id, project_id=project_id)
        except ConversationNotFound as exc:
            raise self._not_found(conversation_id) from exc
        return Response(status=status.HTTP_204_NO_CONTENT)


class AnalyticsView(ApiView):
    """``GET /api/v1/analytics``: the analytics dashboard's numbers (tenant owners and admins)."""

    @extend_schema(
        operation_id="analytics",
        tags=["analytics"],
        summary="Questions per day, latency percentiles, unanswered rate, top questions, feedback, citations",
        description="The numbers of the /analytics/ page for your organization (owners and admins): over the "
        "last `days` UTC days, every project or `project`. Latencies in milliseconds (PostgreSQL "
        "percentile_cont), rates and shares 0..1.",
        parameters=[s.AnalyticsQuerySerializer],
        responses={200: s.AnalyticsSerializer, **_errors(400, 401, 403, 404, 429)},
    )
    def get(self, request: Request) -> Response:
        params = _valid(s.AnalyticsQuerySerializer, request.query_params)
        try:
            analytics = analytics_for_caller(
                api_caller(request), project_slug=params.get("project"), days=params["days"]
            )
        except AnalyticsForbidden as exc:
            raise exceptions.PermissionDenied(str(exc)) from exc
        except ScopeNotFound as exc:
            raise FieldNotFound(str(exc), field="project") from exc
        return Response(analytics.as_dict())
