from django.urls import path

from sources import views

app_name = "sources"

urlpatterns = [
    path("sources/status/", views.status_page, name="status"),
    path("manage/identities/", views.identities_page, name="identities"),
    path("sources/<slug:slug>/sync", views.sync_now, name="sync"),
    path("hooks/git/<uuid:public_id>", views.git_push_hook, name="git_hook"),
]
