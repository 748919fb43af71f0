from django.urls import path

from projects import views

app_name = "projects"
urlpatterns = [
    path("onboarding/", views.onboarding, name="onboarding"),
    path("tokens/", views.tokens, name="tokens"),
    path("tokens/<slug:prefix>/revoke/", views.token_revoke, name="token_revoke"),
    path("manage/", views.manage_home, name="manage"),
    path("manage/people/", views.manage_people, name="manage_people"),
    path("manage/tokens/", views.manage_tokens, name="manage_tokens"),
    path("manage/sso/", views.manage_sso, name="manage_sso"),
    path("invite/<slug:tenant_slug>/<str:token>/", views.invitation, name="invitation"),
]
