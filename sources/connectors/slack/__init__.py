"""Slack, both kinds: ``slack`` (the Web API, kept current by Socket Mode events) and
``slack_export`` (a workspace export, folder or ZIP).

- ``connector.py``, ``client.py``, ``config.py``, ``events.py``: the Web API connector, its
  client and config, and the Events API payloads it follows live;
- ``export_connector.py``, ``export_config.py``, ``export.py``: the export connector, its config
  and the export read in place;
- ``messages.py``, ``rows.py``: Slack messages and the ``thread``, ``conversation`` and
  ``burst`` rows both connectors build from them;
- ``distill.py``: what a thread embeds (its distillation) and which runs become bursts;
- ``live.py``: live events written to a source's rows (services, named by ``sources.services``).
"""
