from django.urls import path

from sources import views

app_name = "sources"

urlpatterns = [
    path("sources/status/", views.status_page, name="status"),
    path("manage/identities/", views.identities_page, name="identities"),
    path("manage/sources/", views.manage_sources, name="manage_sources"),
    path("manage/sources/new/<slug:kind>/", views.manage_source_new, name="manage_source_new"),
    path("manage/sources/<slug:slug>/", views.manage_source_edit, name="manage_source"),
    path("manage/sources/<slug:slug>/delete/", views.manage_source_delete, name="manage_source_delete"),
    path("manage/projects/", views.manage_projects, name="manage_projects"),
    path("manage/projects/<slug:slug>/", views.manage_project, name="manage_project"),
    path("sources/<slug:slug>/sync", views.sync_now, name="sync"),
    path("hooks/git/<uuid:public_id>", views.git_push_hook, name="git_hook"),
]
