from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", include("search.api.urls")),
    path("accounts/", include("allauth.urls")),
    path("", include("projects.urls")),
    path("", include("sources.urls")),
    path("", include("search.urls")),
]

# JSON errors under /api/ (the API's own views answer JSON themselves), Django's pages elsewhere.
handler404 = "search.api.errors.not_found"
handler500 = "search.api.errors.server_error"
