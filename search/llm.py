"""The LLM client: the official ``openai`` client against any OpenAI-compatible endpoint."""

from __future__ import annotations

from django.conf import settings


def llm_configured() -> bool:
    """True when ``OPENAI_BASE_URL`` (or an API key) and ``KB_LLM_MODEL`` are set."""
    return bool(settings.KB_LLM_MODEL and (settings.OPENAI_BASE_URL or settings.OPENAI_API_KEY))


def llm_client():
    """An ``openai.OpenAI`` client for the configured endpoint (timeout ``KB_LLM_TIMEOUT`` s, no retries)."""
    from openai import OpenAI

    return OpenAI(
        base_url=settings.OPENAI_BASE_URL or None,
        api_key=settings.OPENAI_API_KEY or "unused",
        timeout=settings.KB_LLM_TIMEOUT,
        max_retries=0,
    )
