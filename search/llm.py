"""The LLM client: the official ``openai`` client against any OpenAI-compatible endpoint."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from django.conf import settings

_LLM_ALLOWED: ContextVar[bool] = ContextVar("kb_llm_allowed", default=True)


def llm_configured() -> bool:
    """True when ``OPENAI_BASE_URL`` (or an API key) and ``KB_LLM_MODEL`` are set, outside
    :func:`without_llm`."""
    if not _LLM_ALLOWED.get():
        return False
    return bool(settings.KB_LLM_MODEL and (settings.OPENAI_BASE_URL or settings.OPENAI_API_KEY))


@contextmanager
def without_llm() -> Iterator[None]:
    """Inside this block (this thread or task) ``llm_configured()`` is False: nothing calls the LLM."""
    token = _LLM_ALLOWED.set(False)
    try:
        yield
    finally:
        _LLM_ALLOWED.reset(token)


def llm_client():
    """An ``openai.OpenAI`` client for the configured endpoint (timeout ``KB_LLM_TIMEOUT`` s, no retries)."""
    from openai import OpenAI

    return OpenAI(
        base_url=settings.OPENAI_BASE_URL or None,
        api_key=settings.OPENAI_API_KEY or "unused",
        timeout=settings.KB_LLM_TIMEOUT,
        max_retries=0,
    )
