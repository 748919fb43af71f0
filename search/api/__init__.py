"""The DRF API under ``/api/v1/`` for automations: token or session auth, JSON, OpenAPI schema.

Thin views (``views.py``) over the same services and tools as the web pages and the MCP server;
caller-scoped reads in ``selectors.py``, the one write of its own in ``services.py``.
"""
