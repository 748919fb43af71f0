from django.urls import path

from search import views

app_name = "search"
urlpatterns = [
    path("", views.ask_page, name="ask"),
    path("search/", views.search_page, name="search"),
    path("documents/<uuid:source_public_id>/", views.document_page, name="document"),
]
