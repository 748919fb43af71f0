from django.apps import AppConfig


def session_record(sender, request=None, user=None, **kwargs) -> None:
    """Record every sign-in's session in ``allauth.usersessions`` (allauth records only its own
    login flows; Django's ``login()`` from an invitation, the admin or a test client too), so
    removing a member can end all of their sessions (``projects.people.member_remove``)."""
    from allauth.usersessions.models import UserSession

    session = getattr(request, "session", None)
    if session is None or user is None or getattr(user, "pk", None) is None:
        return
    if not session.session_key:
        session.save()
    UserSession.objects.update_or_create(
        session_key=session.session_key,
        defaults={
            "user": user,
            "ip": request.META.get("REMOTE_ADDR") or "0.0.0.0",
            "user_agent": request.META.get("HTTP_USER_AGENT", "")[:200],
        },
    )


def onboarding_redirect(user, url: str) -> str | None:
    """Where a user goes after signing in instead of ``url``: onboarding (choose a default
    project) until they have done it once, for a member of an organization; else ``None``."""
    from django.urls import reverse
    from django.utils.http import urlencode

    from projects.models import Profile
    from projects.selectors import membership_list_for_user

    profile = Profile.objects.filter(user=user).first()
    if profile is not None and profile.onboarded_at is not None:
        return None
    if not membership_list_for_user(user):
        return None  # the ask page sends them to create or join an organization
    return reverse("projects:onboarding") + "?" + urlencode({"next": url})


class ProjectsConfig(AppConfig):
    name = "projects"
    verbose_name = "Tenants and projects"

    def ready(self) -> None:
        # The base floor's audit log asks this floor which tenant a user works in (login and
        # logout events); it cannot import projects itself.
        from django.contrib.auth.signals import user_logged_in
        from django.db.models.signals import post_delete, post_save

        from kbportal.audit import audit_register_user_tenant
        from kbportal.sso import sso_register_login_redirect
        from projects.models import Membership, Profile
        from projects.selectors import forget_request_memo, user_tenant_id

        for model in (Membership, Profile):  # a request never reads its own membership writes stale
            for signal, name in ((post_save, "save"), (post_delete, "delete")):
                signal.connect(forget_request_memo, sender=model, dispatch_uid=f"projects.memo.{model.__name__}.{name}")

        audit_register_user_tenant(user_tenant_id)
        user_logged_in.connect(session_record, dispatch_uid="projects.session_record")
        sso_register_login_redirect(onboarding_redirect)
