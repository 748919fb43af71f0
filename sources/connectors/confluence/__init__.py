"""Confluence pages through the REST API or an HTML space export (kind ``confluence``)."""
