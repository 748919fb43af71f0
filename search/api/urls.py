"""``/api/v1/``: the endpoints, the OpenAPI schema and its docs page (served offline via the sidecar)."""

from django.urls import path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from search.api import views

app_name = "api"
urlpatterns = [
    path("ask", views.AskView.as_view(), name="ask"),
    path("search", views.SearchView.as_view(), name="search"),
    path("who-knows", views.WhoKnowsView.as_view(), name="who_knows"),
    path("projects", views.ProjectListView.as_view(), name="projects"),
    path("sources", views.SourceListView.as_view(), name="sources"),
    path("sources/<slug:slug>/sync", views.SourceSyncView.as_view(), name="source_sync"),
    path("runs", views.RunListView.as_view(), name="runs"),
    path("answers/<uuid:answer_id>/feedback", views.AnswerFeedbackView.as_view(), name="answer_feedback"),
    path("conversations", views.ConversationListView.as_view(), name="conversations"),
    path("conversations/<uuid:conversation_id>", views.ConversationDetailView.as_view(), name="conversation"),
    path("analytics", views.AnalyticsView.as_view(), name="analytics"),
    path("schema", SpectacularAPIView.as_view(), name="schema"),
    path("docs", SpectacularSwaggerSplitView.as_view(url_name="api:schema"), name="docs"),
]
