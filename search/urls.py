from django.urls import path

from search import conversation_views, review_views, views

app_name = "search"
urlpatterns = [
    path("", views.ask_page, name="ask"),
    path("ask/stream", views.ask_stream_view, name="ask_stream"),
    path("answers/<uuid:answer_id>/", conversation_views.shared_answer_page, name="shared_answer"),
    path("answers/<uuid:answer_id>/feedback", views.answer_feedback, name="answer_feedback"),
    path("answers/<uuid:answer_id>/verify", conversation_views.answer_verify_view, name="answer_verify"),
    path("conversations/", conversation_views.conversation_list_page, name="conversations"),
    path(
        "conversations/<uuid:conversation_id>/delete",
        conversation_views.conversation_delete_view,
        name="conversation_delete",
    ),
    path("search/", views.search_page, name="search"),
    path("people/", views.people_page, name="people"),
    path("documents/<uuid:source_public_id>/", views.document_page, name="document"),
    path("audit/", views.audit_page, name="audit"),
    path("audit/export.csv", views.audit_export, name="audit_export"),
    path("analytics/", views.analytics_page, name="analytics"),
    path("reviews/", review_views.review_page, name="reviews"),
    path("reviews/export.jsonl", review_views.review_export, name="review_export"),
]
