"""Live Slack connector: backfill through the Web API, updates through Socket Mode events."""
