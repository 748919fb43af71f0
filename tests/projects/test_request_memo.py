"""The per-request memo of the signed-in user's memberships and profile
(``projects.selectors._request_memo``): one request's, emptied by every write, never kept past a
rolled-back transaction."""

import threading

import pytest
from django.db import transaction
from django.test import RequestFactory

from kbportal import middleware


class _Boom(Exception):
    pass


@pytest.mark.django_db
def test_a_rolled_back_membership_write_is_not_remembered(make_tenant):
    """A membership written, read, then rolled back: the rest of the request does not see it (a
    rollback sends no signal, so nothing read inside the transaction is remembered)."""
    from projects.models import Membership
    from projects.selectors import user_is_tenant_admin, user_tenant_id
    from projects.services import membership_create

    a = make_tenant("memo-a")
    b = make_tenant("memo-b")
    user = a.admin
    request = RequestFactory().get("/")
    token = middleware._current_request.set(request)
    try:
        assert user_tenant_id(user) == a.tenant.pk
        try:
            with transaction.atomic():
                membership_create(tenant_id=b.tenant.pk, user=user, role=Membership.Role.ADMIN)
                assert user_is_tenant_admin(user, b.tenant.pk)  # memoised inside the transaction
                raise _Boom
        except _Boom:
            pass
        stale = user_is_tenant_admin(user, b.tenant.pk)
        assert not stale, "memo still grants admin of a tenant whose membership was rolled back"
    finally:
        middleware._current_request.reset(token)


def test_each_request_has_its_own_memo_and_none_outside_a_request():
    from projects.selectors import _request_memo

    r1, r2 = RequestFactory().get("/"), RequestFactory().get("/")
    seen = {}

    def run(name, req):
        tok = middleware._current_request.set(req)
        try:
            seen[name] = id(_request_memo())
        finally:
            middleware._current_request.reset(tok)

    t1 = threading.Thread(target=run, args=("a", r1))
    t2 = threading.Thread(target=run, args=("b", r2))
    for t in (t1, t2):
        t.start()
    for t in (t1, t2):
        t.join()
    assert seen["a"] != seen["b"]
    seen_outside = {}
    t3 = threading.Thread(target=lambda: seen_outside.setdefault("x", _request_memo()))
    t3.start()
    t3.join()
    assert seen_outside["x"] is None


@pytest.mark.django_db
def test_role_default_project_and_removal_written_in_a_request_are_read_at_once(make_tenant):
    from django.contrib.auth import get_user_model

    from projects.models import Membership
    from projects.people import member_remove, member_set_role
    from projects.selectors import user_is_tenant_admin, user_tenant_id
    from projects.services import membership_create, profile_set_default_project, project_create
    from sources.selectors import ScopeNotFound, scope_for_user

    a = make_tenant("memo-w")
    u = get_user_model().objects.create_user("memo-w-user", "u@w.example", "p" * 12)
    membership_create(tenant_id=a.tenant.pk, user=u, role=Membership.Role.ADMIN)
    profile_set_default_project(user=u, tenant_id=a.tenant.pk, project_id=a.project.pk)
    other = project_create(tenant_id=a.tenant.pk, name="Other")
    request = RequestFactory().get("/")
    token = middleware._current_request.set(request)
    try:
        assert user_is_tenant_admin(u, a.tenant.pk)
        member_set_role(tenant_id=a.tenant.pk, actor_user=a.admin, user_id=u.pk, role="member")
        assert not user_is_tenant_admin(u, a.tenant.pk)
        assert scope_for_user(u).project_id == a.project.pk
        profile_set_default_project(user=u, tenant_id=a.tenant.pk, project_id=other.pk)
        assert scope_for_user(u).project_id == other.pk
        member_remove(tenant_id=a.tenant.pk, actor_user=a.admin, user_id=u.pk)
        assert user_tenant_id(u) is None
        with pytest.raises(ScopeNotFound):
            scope_for_user(u)
        # queryset.update() sends no signal: a caller that forgets forget_request_memo() reads stale
        membership_create(tenant_id=a.tenant.pk, user=u, role=Membership.Role.MEMBER)
        assert not user_is_tenant_admin(u, a.tenant.pk)
    finally:
        middleware._current_request.reset(token)
