"""The LLM client: the official ``openai`` client against any OpenAI-compatible endpoint.

The one place it is built, for the answer pipeline (``search.llm``) and Slack thread
distillation (``sources.connectors.slack.distill``) alike: ``OPENAI_BASE_URL`` and
``OPENAI_API_KEY`` name the endpoint, ``KB_LLM_MODEL`` the model.
"""

from __future__ import annotations

from django.conf import settings


def llm_model() -> str:
    """``KB_LLM_MODEL`` when it and an endpoint (``OPENAI_BASE_URL`` or an API key) are set, else ``""``."""
    if settings.KB_LLM_MODEL and (settings.OPENAI_BASE_URL or settings.OPENAI_API_KEY):
        return settings.KB_LLM_MODEL
    return ""


def llm_client():
    """An ``openai.OpenAI`` client for the configured endpoint (timeout ``KB_LLM_TIMEOUT`` s, no retries)."""
    from openai import OpenAI

    return OpenAI(
        base_url=settings.OPENAI_BASE_URL or None,
        api_key=settings.OPENAI_API_KEY or "unused",
        timeout=settings.KB_LLM_TIMEOUT,
        max_retries=0,
    )
