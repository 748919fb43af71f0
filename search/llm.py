"""The LLM as the answer pipeline sees it: configured or not (and switched off by
:func:`without_llm`), and the client, built by :mod:`kbportal.llm_client`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from kbportal.llm_client import llm_client, llm_model

__all__ = ["llm_client", "llm_configured", "without_llm"]

_LLM_ALLOWED: ContextVar[bool] = ContextVar("kb_llm_allowed", default=True)


def llm_configured() -> bool:
    """True when ``OPENAI_BASE_URL`` (or an API key) and ``KB_LLM_MODEL`` are set, outside
    :func:`without_llm`."""
    if not _LLM_ALLOWED.get():
        return False
    return bool(llm_model())


@contextmanager
def without_llm() -> Iterator[None]:
    """Inside this block (this thread or task) ``llm_configured()`` is False: nothing calls the LLM."""
    token = _LLM_ALLOWED.set(False)
    try:
        yield
    finally:
        _LLM_ALLOWED.reset(token)
