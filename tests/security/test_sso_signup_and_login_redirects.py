"""SSO linking, self-signup and login redirects under attack: each test asserts the safe behaviour.

Findings fixed here:
- public self-signup at /accounts/signup/ was open (allauth's default): a stranger could create an
  account with someone else's email and wait for that person's first SSO login to be linked to it
  (SOCIALACCOUNT_EMAIL_AUTHENTICATION), keeping a way back in through a second address of theirs;
- an SSO login was linked to a local account whose matching address that account had only
  asserted itself (an unverified address added at /accounts/email/), handing the provider's
  person (and the tenant membership the login grants) to whoever added it.
"""

from __future__ import annotations

import pytest
from allauth.account.models import EmailAddress
from allauth.core import context as allauth_context
from allauth.core.exceptions import ImmediateHttpResponse
from allauth.socialaccount.models import SocialAccount, SocialLogin
from django.contrib.auth import get_user_model
from django.contrib.sessions.middleware import SessionMiddleware
from django.test import Client, RequestFactory

pytestmark = pytest.mark.django_db

DOMAIN = "s3.example.com"


# ---------- SSO ------------------------------------------------------------------------------------


@pytest.fixture
def idp(make_tenant):
    from kbportal.sso import sso_provider_create

    t = make_tenant("atk-s3")
    binding = sso_provider_create(
        tenant_id=t.tenant.pk,
        name="S3 IdP",
        provider_id="atk-s3-idp",
        server_url="https://idp.s3.example.com",
        client_id="cid",
        secret="sec",
        domains=[DOMAIN],
    )
    return t, binding


def _sso_login(binding, email: str, *, uid: str = "sub-1", verified: bool = True):
    """Run allauth's lookup and the tenant adapter's pre_social_login for a provider assertion."""
    from kbportal.sso import TenantSocialAccountAdapter

    request = RequestFactory().get("/accounts/oidc/atk-s3-idp/login/callback/")
    SessionMiddleware(lambda r: None).process_request(request)
    request.user = __import__("django.contrib.auth.models", fromlist=["AnonymousUser"]).AnonymousUser()
    with allauth_context.request_context(request):
        provider = binding.social_app.get_provider(request)
        login = SocialLogin(
            account=SocialAccount(provider=binding.social_app.provider_id, uid=uid, extra_data={}),
            provider=provider,
            user=get_user_model()(email=email),
            email_addresses=[EmailAddress(email=email, verified=verified, primary=True)],
        )
        login.lookup()
        TenantSocialAccountAdapter(request).pre_social_login(request, login)
    return login


def test_public_signup_is_closed():
    before = get_user_model().objects.count()
    c = Client(raise_request_exception=False)
    c.post(
        "/accounts/signup/",
        {
            "username": "mallory",
            "email": f"victim@{DOMAIN}",
            "password1": "Very-long-pass-123",
            "password2": "Very-long-pass-123",
        },
    )
    assert get_user_model().objects.count() == before, "a stranger created an account at /accounts/signup/"


def test_sso_first_login_still_may_create_the_user(idp):
    from kbportal.sso import SsoAccountAdapter, TenantSocialAccountAdapter

    request = RequestFactory().get("/")
    assert TenantSocialAccountAdapter(request).is_open_for_signup(request, None) is True
    assert SsoAccountAdapter(request).is_open_for_signup(request) is False


def test_sso_is_not_linked_to_an_account_that_only_asserted_the_address_itself(idp):
    t, binding = idp
    User = get_user_model()
    mallory = User.objects.create_user("mallory-s3", "mallory@elsewhere.example", "m" * 12)
    # Mallory adds the victim's address to her own account (/accounts/email/ creates it unverified).
    EmailAddress.objects.create(user=mallory, email=f"victim@{DOMAIN}", verified=False, primary=False)
    EmailAddress.objects.create(user=mallory, email="mallory@elsewhere.example", verified=False, primary=True)
    with pytest.raises(ImmediateHttpResponse) as refused:
        _sso_login(binding, f"victim@{DOMAIN}")
    assert refused.value.response.status_code == 403
    from projects.selectors import membership_list_for_user

    assert not membership_list_for_user(mallory), "the victim's SSO login joined Mallory's account to the tenant"


def test_sso_links_an_operator_created_account_with_that_email(idp):
    t, binding = idp
    dave = get_user_model().objects.create_user("dave-s3", f"dave@{DOMAIN}", "d" * 12)
    login = _sso_login(binding, f"dave@{DOMAIN}", uid="sub-dave")
    assert login.user.pk == dave.pk


@pytest.mark.parametrize(
    "email",
    [
        f"eve@{DOMAIN}.",
        f"eve@{DOMAIN.upper()}x",
        f"eve@sub.{DOMAIN}",
        f"eve@{DOMAIN}.evil.test",
        "eve@s3.exаmple.com",
        f'"eve@{DOMAIN}"@evil.test',
        f"eve@evil.test\n@{DOMAIN}x",
    ],
)
def test_sso_domain_confusion_is_refused(idp, email):
    t, binding = idp
    with pytest.raises(ImmediateHttpResponse):
        _sso_login(binding, email, uid=f"sub-{hash(email)}")


def test_sso_unverified_email_is_refused(idp):
    t, binding = idp
    with pytest.raises(ImmediateHttpResponse):
        _sso_login(binding, f"frank@{DOMAIN}", uid="sub-frank", verified=False)


@pytest.mark.parametrize("nxt", ["https://evil.example/", "//evil.example/", "/\\evil.example", "https:evil.example"])
def test_login_and_logout_next_never_leave_the_site(make_tenant, nxt):
    make_tenant("atk-s3n")
    c = Client(raise_request_exception=False)
    r = c.post(f"/accounts/login/?next={nxt}", {"login": "atk-s3n-admin", "password": "pw-" + "atk-s3n" * 2})
    assert r.status_code == 302 and "evil.example" not in r["Location"], r.get("Location")
    r = c.post("/accounts/logout/", {"next": nxt})
    assert "evil.example" not in r.get("Location", ""), r.get("Location")
