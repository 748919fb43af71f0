"""Test fixtures: a real PostgreSQL + pgvector test database, built by the owner role.

The test database is created and migrated through the ``owner`` alias (the table owner, as in
production); tests then run on ``default``, the app role without ``BYPASSRLS``, so row-level
security is exercised exactly as in production.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# ../shared beside the project (evaluation sets, corpora); KB_SHARED_DIR points elsewhere (a path
# that does not exist shows what a bare clone runs).
SHARED = Path(os.environ.get("KB_SHARED_DIR") or Path(__file__).resolve().parent.parent.parent / "shared").resolve()


@pytest.fixture(scope="session")
def django_db_setup(django_test_environment, django_db_blocker):
    from django.db import connections

    with django_db_blocker.unblock():
        owner = connections["owner"]
        old_name = owner.settings_dict["NAME"]
        # One test database per run, so concurrent runs on one machine do not clobber each other.
        owner.settings_dict.setdefault("TEST", {})["NAME"] = f"test_{old_name}_{os.getpid()}"
        test_name = owner.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False, serialize=False)
        connections["default"].close()
        connections["default"].settings_dict["NAME"] = test_name
    yield
    with django_db_blocker.unblock():
        connections["default"].close()
        connections["default"].settings_dict["NAME"] = old_name
        owner.creation.destroy_test_db(old_name, verbosity=0)


def database_url(settings: dict) -> str:
    """A ``postgres://`` URL for a Django connection's settings (``DATABASE_URL``'s format)."""
    from urllib.parse import quote

    password = f":{quote(settings['PASSWORD'], safe='')}" if settings["PASSWORD"] else ""
    auth = quote(settings["USER"], safe="") + password
    return f"postgres://{auth}@{quote(settings['HOST'] or 'localhost', safe='')}:{settings['PORT']}/{settings['NAME']}"


def subprocess_database_env() -> dict[str, str]:
    """This process's environment with ``DATABASE_URL`` / ``DATABASE_OWNER_URL`` naming this
    run's test database (app role and owner), for ``manage.py``, Celery or gunicorn children."""
    from django.db import connections

    env = dict(os.environ)
    env["DATABASE_URL"] = database_url(connections["default"].settings_dict)
    env["DATABASE_OWNER_URL"] = database_url(connections["owner"].settings_dict)
    return env


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.exists():
        pytest.skip(f"needs the shared data folder {SHARED} (../shared beside the project: corpora, evaluation sets)")
    return SHARED


@pytest.fixture
def make_tenant(db):
    """Factory: ``make_tenant("acme")`` -> (tenant, admin user, member user, project)."""
    from projects.services import tenant_onboard

    def factory(slug: str):
        return tenant_onboard(
            name=slug.title(), slug=slug, admin_username=f"{slug}-admin", admin_password="pw-" + slug * 2
        )

    return factory


@pytest.fixture(scope="session", autouse=True)
def _fast_password_hashing():
    """Django's recommended test speed-up: an MD5 password hasher instead of PBKDF2's million
    iterations (~0.4 s a hash on 2 cores; every tenant onboarded and every password login hashes),
    for the whole session, so module-scoped fixtures' users hash fast too. What the tests assert
    about passwords (checked, rejected, locked out) is the same under any hasher; servers the
    tests start as processes keep the production hashers."""
    from django.test import override_settings

    with override_settings(PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"]):
        yield


@pytest.fixture(autouse=True)
def _no_llm_from_the_environment(settings):
    """A developer's shell may point OPENAI_BASE_URL / KB_LLM_MODEL at a real model; tests run
    without one unless they start their own loopback server (``tests.llm_server``)."""
    settings.OPENAI_BASE_URL = ""
    settings.OPENAI_API_KEY = ""
    settings.KB_LLM_MODEL = ""


@pytest.fixture(autouse=True)
def _empty_cache():
    """Rate-limit counts (the web ask limit, DRF throttles, allauth) live in Django's cache, which
    outlives a test; each test starts with none, so one test's questions never throttle another's."""
    from django.core.cache import cache

    cache.clear()
    yield
