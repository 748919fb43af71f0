"""Slack workspace export connector: threads and conversations from a Slack export folder or ZIP."""
