"""The organization's people, as its owners and admins manage them from ``/manage/people/``:
invite by email with a role, accept an invitation, change a role, remove a member.

Every write runs in the tenant's context (row-level security) and records one audit event with
its actor in the same transaction. Rules (each raises :class:`PeopleError` with a message that
says what was refused):

- owners and admins manage people; only an owner grants, changes or removes the ``owner`` role;
- the last owner cannot be demoted or removed (the organization would have nobody to run it);
- nobody changes or removes themselves here (an owner leaves by handing the role on first).

Removing a member deletes their membership and project memberships in this organization, revokes
their API tokens of this organization, withdraws the invitations they sent and ends their
signed-in sessions (``allauth.usersessions``) at once; their account stays, with any other
organization's membership. A demoted member's invitations for roles they may no longer grant are
withdrawn too. The invitation link is only ever mailed to the invited address, never shown to
the inviter: holding it is what proves the address.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import timedelta

from allauth.account.models import EmailAddress
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import transaction
from django.utils import timezone

from kbportal.audit import audit_record
from kbportal.emails import email_key
from kbportal.tenancy import tenant_context
from projects.models import ApiToken, Invitation, Membership, Profile, Project, ProjectMember, Tenant
from projects.selectors import forget_request_memo, project_queryset_readable
from projects.services import project_member_add

INVITATION_DAYS = 7
_ROLES = {r.value for r in Membership.Role}


class PeopleError(ValueError):
    """A people-management request was refused; the message says why."""


@dataclass(frozen=True)
class Actor:
    """Who acts: a user and their role in the tenant."""

    user: object
    role: str


def _actor(tenant_id: int, user) -> Actor:
    membership = Membership.objects.filter(tenant_id=tenant_id, user_id=user.pk).first()
    if membership is None or not membership.is_admin:
        raise PeopleError("only the organization's owners and admins manage its people")
    return Actor(user=user, role=membership.role)


def _check_role(role: str, actor: Actor) -> None:
    if role not in _ROLES:
        raise PeopleError(f"unknown role {role!r}: choose one of {', '.join(sorted(_ROLES))}")
    if role == Membership.Role.OWNER and actor.role != Membership.Role.OWNER:
        raise PeopleError("only an owner may make someone an owner")


def _valid_email(address: str) -> str:
    """``address`` as invitations store it (:func:`kbportal.emails.email_key`); raises
    :class:`PeopleError` unless it is an email address of at most 254 characters."""
    email = email_key(address)
    try:
        if len(email) > 254:
            raise ValidationError("too long")
        validate_email(email)
    except ValidationError:
        raise PeopleError(f"{email[:100]!r} is not an email address of at most 254 characters") from None
    return email


def invitation_token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def member_invite(
    *, tenant_id: int, actor_user, email: str, role: str, project_id: int | None = None
) -> tuple[Invitation, str]:
    """Invite ``email`` to the tenant as ``role``; returns ``(invitation, plain token)``. With
    ``project_id``, the new member also joins that project as a viewer on accepting, and it
    becomes their default project.

    The token (43 URL-safe characters, ~256 bits) goes into the link
    ``/invite/<tenant slug>/<token>/`` and is not kept. Raises :class:`PeopleError` for a bad
    address or role, a project not of this organization, or an address that already belongs to a
    member.
    """
    email = _valid_email(email)
    with tenant_context(tenant_id, user_id=actor_user.pk):
        actor = _actor(tenant_id, actor_user)
        _check_role(role, actor)
        project = Project.objects.filter(pk=project_id).first() if project_id is not None else None
        if project_id is not None and project is None:
            raise PeopleError("project: not a project of this organization")
        member_ids = list(Membership.objects.values_list("user_id", flat=True))
        known = EmailAddress.objects.filter(user_id__in=member_ids).values_list("email", flat=True)
        if email in {email_key(e) for e in known}:
            raise PeopleError(f"{email} already belongs to a member of this organization")
        token = secrets.token_urlsafe(32)
        invitation = Invitation.objects.create(
            tenant_id=tenant_id,
            email=email,
            role=role,
            token_hash=invitation_token_hash(token),
            invited_by=actor_user,
            expires_at=timezone.now() + timedelta(days=INVITATION_DAYS),
            project=project,
        )
        audit_record(
            action="member.invite",
            tenant_id=tenant_id,
            actor=actor_user,
            object_type="projects.invitation",
            object_id=invitation.pk,
            data={
                "email": email,
                "role": role,
                "expires_at": invitation.expires_at,
                "project": project.slug if project else None,
            },
        )
    return invitation, token


def operator_invite(*, tenant_id: int, email: str, role: str = Membership.Role.OWNER) -> tuple[Invitation, str]:
    """The platform operator invites ``email`` (``manage.py tenant add``: a new organization's first
    owner); returns ``(invitation, plain token)`` as :func:`member_invite` does. Raises
    :class:`PeopleError` for a bad address or role. Writes ``member.invite`` with no actor."""
    email = _valid_email(email)
    if role not in _ROLES:
        raise PeopleError(f"unknown role {role!r}: choose one of {', '.join(sorted(_ROLES))}")
    token = secrets.token_urlsafe(32)
    with tenant_context(tenant_id):
        invitation = Invitation.objects.create(
            tenant_id=tenant_id,
            email=email,
            role=role,
            token_hash=invitation_token_hash(token),
            expires_at=timezone.now() + timedelta(days=INVITATION_DAYS),
            sent_by_operator=True,
        )
        audit_record(
            action="member.invite",
            tenant_id=tenant_id,
            actor=None,
            object_type="projects.invitation",
            object_id=invitation.pk,
            data={"email": email, "role": role, "by": "operator"},
        )
    return invitation, token


def invitation_revoke(*, tenant_id: int, actor_user, invitation_id: int) -> None:
    """Withdraw a pending invitation. Raises :class:`PeopleError` when there is none to withdraw."""
    with tenant_context(tenant_id, user_id=actor_user.pk):
        _actor(tenant_id, actor_user)
        invitation = Invitation.objects.filter(pk=invitation_id, accepted_at__isnull=True, revoked_at__isnull=True)
        found = invitation.first()
        if found is None:
            raise PeopleError("no such pending invitation")
        invitation.update(revoked_at=timezone.now())
        audit_record(
            action="member.invite_revoke",
            tenant_id=tenant_id,
            actor=actor_user,
            object_type="projects.invitation",
            object_id=found.pk,
            data={"email": found.email},
        )


def invitation_get(*, tenant_slug: str, token: str) -> Invitation:
    """The pending, unexpired invitation of this tenant and token; raises :class:`PeopleError`."""
    tenant = Tenant.objects.filter(slug=tenant_slug).first()
    if tenant is None or not token:
        raise PeopleError("this invitation link is not valid")
    with tenant_context(tenant.pk):
        invitation = Invitation.objects.filter(token_hash=invitation_token_hash(token)).first()
    if invitation is None or invitation.revoked_at is not None or invitation.accepted_at is not None:
        raise PeopleError("this invitation link is not valid, or was already used")
    if invitation.expires_at <= timezone.now():
        raise PeopleError("this invitation has expired: ask for a new one")
    return invitation


def invitation_accept(*, tenant_slug: str, token: str, user, new_account: bool = False) -> Membership:
    """Accept the invitation as ``user``: they join with its role, and a readable project becomes
    their default if they have none in this tenant.

    ``user`` must have verified the invitation's address, unless ``new_account`` (the account was
    just created from the link, which was only ever mailed to that address, so holding it proves
    the address: it is stored verified). The inviter must still be an owner or admin (an owner
    for an owner invitation), and ``user`` not yet a member.
    Raises :class:`PeopleError`. Writes ``member.join``.
    """
    invitation = invitation_get(tenant_slug=tenant_slug, token=token)
    with transaction.atomic():
        if new_account:
            EmailAddress.objects.create(user=user, email=invitation.email, verified=True, primary=True)
        else:
            verified = EmailAddress.objects.filter(user=user, verified=True).values_list("email", flat=True)
            if invitation.email not in {email_key(e) for e in verified}:
                raise PeopleError(
                    f"this invitation is for {invitation.email}; you are signed in as {user.get_username()}, "
                    "who has not verified that address"
                )
        with tenant_context(invitation.tenant_id, user_id=user.pk):
            # The inviter's authority is checked again: a removed admin's or a demoted owner's
            # pending invitation grants nothing.
            inviter = Membership.objects.filter(user_id=invitation.invited_by_id).first()
            if not invitation.sent_by_operator and (
                inviter is None
                or not inviter.is_admin
                or (invitation.role == Membership.Role.OWNER and inviter.role != Membership.Role.OWNER)
            ):
                raise PeopleError(
                    "this invitation is no longer valid: its sender may no longer invite as " + invitation.role
                )
            if Membership.objects.filter(user=user).exists():
                raise PeopleError(f"{user.get_username()} is already a member of this organization")
            claimed = Invitation.objects.filter(pk=invitation.pk, accepted_at__isnull=True, revoked_at__isnull=True)
            if not claimed.update(accepted_at=timezone.now(), accepted_by=user):
                raise PeopleError("this invitation link was already used")
            membership, created = Membership.objects.get_or_create(
                tenant_id=invitation.tenant_id, user=user, defaults={"role": invitation.role}
            )
            audit_record(
                action="member.join",
                tenant_id=invitation.tenant_id,
                actor=user,
                object_type="projects.membership",
                object_id=membership.pk,
                data={"email": invitation.email, "role": membership.role, "via": "invitation"},
            )
            # The invitation's project: they join it as a viewer (a members-only project is
            # readable only so) and it becomes their default.
            invited_to = Project.objects.filter(pk=invitation.project_id).first() if invitation.project_id else None
            if invited_to is not None:
                project_member_add(project=invited_to, user=user)
            # A first organization becomes the one they work in, scoped to the invitation's
            # project or else its oldest project they may read (as an SSO first login does); they
            # can pick another on /onboarding/.
            profile, _ = Profile.objects.get_or_create(user=user)
            if profile.tenant_id is None:
                first = invited_to or project_queryset_readable(user_id=user.pk).order_by("created_at", "pk").first()
                profile.tenant_id = invitation.tenant_id
                profile.default_project = first
                profile.save(update_fields=["tenant", "default_project"])
    return membership


def member_set_role(*, tenant_id: int, actor_user, user_id: int, role: str) -> Membership:
    """Change a member's role. Raises :class:`PeopleError` (see the module's rules)."""
    with tenant_context(tenant_id, user_id=actor_user.pk):
        _lock_people(tenant_id)
        actor = _actor(tenant_id, actor_user)
        _check_role(role, actor)
        membership = Membership.objects.select_for_update().filter(user_id=user_id).first()
        if membership is None:
            raise PeopleError("no such member")
        _check_target(membership, actor)
        if membership.role == Membership.Role.OWNER and role != Membership.Role.OWNER:
            _keep_an_owner(membership)
        before = membership.role
        membership.role = role
        membership.save(update_fields=["role"])
        may_invite: set[str] = set(_ROLES) if role == "owner" else _ROLES - {"owner"} if role == "admin" else set()
        withdrawn = _revoke_invitations_by(membership.user_id, keep_roles=may_invite)
        audit_record(
            action="member.role",
            tenant_id=tenant_id,
            actor=actor_user,
            object_type="projects.membership",
            object_id=membership.pk,
            data={
                "user": membership.user.get_username(),
                "from": before,
                "to": role,
                "invitations_withdrawn": withdrawn,
            },
        )
    return membership


def member_remove(*, tenant_id: int, actor_user, user_id: int) -> dict[str, int]:
    """Remove a member from the tenant: membership, project memberships, their API tokens of this
    tenant (revoked) and their signed-in sessions (ended), in one transaction with the
    ``member.remove`` audit event. Returns ``{"tokens_revoked": n, "sessions_ended": n}``. Raises
    :class:`PeopleError` (see the module's rules)."""
    from allauth.usersessions.models import UserSession

    with tenant_context(tenant_id, user_id=actor_user.pk):
        _lock_people(tenant_id)
        actor = _actor(tenant_id, actor_user)
        membership = Membership.objects.select_for_update().filter(user_id=user_id).first()
        if membership is None:
            raise PeopleError("no such member")
        _check_target(membership, actor)
        if membership.role == Membership.Role.OWNER:
            _keep_an_owner(membership)
        user = membership.user
        ProjectMember.objects.filter(user_id=user_id).delete()
        tokens = ApiToken.objects.filter(user_id=user_id, revoked_at__isnull=True).update(revoked_at=timezone.now())
        membership_id, role = membership.pk, membership.role
        membership.delete()
        withdrawn = _revoke_invitations_by(user_id, keep_roles=set())
        sessions = 0
        for session in UserSession.objects.filter(user_id=user_id):
            session.end()
            sessions += 1
        Profile.objects.filter(user_id=user_id, tenant_id=tenant_id).update(tenant=None, default_project=None)
        forget_request_memo()  # update() sends no signal
        audit_record(
            action="member.remove",
            tenant_id=tenant_id,
            actor=actor_user,
            object_type="projects.membership",
            object_id=membership_id,
            data={
                "user": user.get_username(),
                "role": role,
                "tokens_revoked": tokens,
                "sessions_ended": sessions,
                "invitations_withdrawn": withdrawn,
            },
        )
    return {"tokens_revoked": tokens, "sessions_ended": sessions}


def _lock_people(tenant_id: int) -> None:
    """Serialize people changes of one tenant (its row locked for the transaction): two owners
    demoting each other at once then run one after the other, never deadlock."""
    list(Tenant.objects.select_for_update().filter(pk=tenant_id).values_list("pk", flat=True))


def _revoke_invitations_by(user_id: int, *, keep_roles: set[str]) -> int:
    """Withdraw the pending invitations ``user_id`` sent whose role is not in ``keep_roles``."""
    pending = Invitation.objects.filter(invited_by_id=user_id, accepted_at__isnull=True, revoked_at__isnull=True)
    return pending.exclude(role__in=keep_roles).update(revoked_at=timezone.now())


def _check_target(membership: Membership, actor: Actor) -> None:
    if membership.user_id == getattr(actor.user, "pk", None):
        raise PeopleError("you cannot change or remove your own membership here")
    if membership.role == Membership.Role.OWNER and actor.role != Membership.Role.OWNER:
        raise PeopleError("only an owner may change or remove an owner")


def _keep_an_owner(membership: Membership) -> None:
    owners = Membership.objects.select_for_update().filter(role=Membership.Role.OWNER).exclude(pk=membership.pk)
    if not owners.exists():
        raise PeopleError("the organization's last owner cannot be demoted or removed")


def people_list(*, tenant_id: int) -> tuple[list[Membership], list[Invitation]]:
    """The tenant's members (with their users, by username) and its pending invitations."""
    with tenant_context(tenant_id):
        members = list(Membership.objects.select_related("user").order_by("user__username"))
        pending = list(
            Invitation.objects.filter(accepted_at__isnull=True, revoked_at__isnull=True, expires_at__gt=timezone.now())
            .select_related("project")
            .order_by("email")
        )
    return members, pending


def user_for_invitation(*, username: str, password: str, email: str):
    """A new account for an invitation's address (the caller validated the password)."""
    User = get_user_model()
    username = (username or "").strip()
    try:
        User.username_validator(username)
    except ValidationError:
        raise PeopleError("a username may hold letters, digits and . + - _ only") from None
    if "@" in username:
        raise PeopleError("a username may not contain @ (it would read as someone's address)")
    if User.objects.filter(email__iexact=email).exists() or EmailAddress.objects.filter(email__iexact=email).exists():
        raise PeopleError(f"an account with {email} exists: sign in with it, then open this link again")
    if User.objects.filter(username__iexact=username).exists():
        raise PeopleError(f"the username {username!r} is taken")
    return User.objects.create_user(username=username, email=email, password=password)
