from django.apps import AppConfig


class ProjectsConfig(AppConfig):
    name = "projects"
    verbose_name = "Tenants and projects"

    def ready(self) -> None:
        # The base floor's audit log asks this floor which tenant a user works in (login and
        # logout events); it cannot import projects itself.
        from kbportal.audit import audit_register_user_tenant
        from projects.selectors import user_tenant_id

        audit_register_user_tenant(user_tenant_id)
