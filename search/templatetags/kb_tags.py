"""Display helpers for the templates: which links a user's role shows, a share as a percentage."""

from __future__ import annotations

from typing import Any

from django import template

from projects.selectors import user_is_admin_of_own_tenant

register = template.Library()


@register.filter
def is_tenant_admin(user: Any) -> bool:
    """True when ``user`` is an owner or admin of the tenant they work in (Audit and Analytics links)."""
    if not getattr(user, "is_authenticated", False):
        return False
    return user_is_admin_of_own_tenant(user)


@register.filter
def percent(share: float | None) -> str:
    """A share (0..1) as a percentage with one decimal (``0.25`` -> ``25.0%``); ``-`` for none."""
    return "-" if share is None else f"{share * 100:.1f}%"
