from django.contrib import admin

from kbportal.admin import OwnerDatabaseAdmin
from search.models import AnswerFeedback, AnswerRecord


@admin.register(AnswerRecord)
class AnswerRecordAdmin(OwnerDatabaseAdmin):
    list_display = [
        "question",
        "tenant",
        "user",
        "answered",
        "synthesizer",
        "latency_ms",
        "first_token_ms",
        "created_at",
    ]
    list_filter = ["tenant", "answered", "synthesizer"]
    search_fields = ["question"]
    readonly_fields = [f.name for f in AnswerRecord._meta.fields]


@admin.register(AnswerFeedback)
class AnswerFeedbackAdmin(OwnerDatabaseAdmin):
    list_display = ["question", "vote", "user", "tenant", "created_at"]
    list_filter = ["tenant", "vote"]
    search_fields = ["question", "comment"]
    readonly_fields = [f.name for f in AnswerFeedback._meta.fields]
