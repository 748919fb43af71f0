"""Jira issues through the REST API or a CSV export (kind ``jira``)."""
