"""The generic JSON documents connector: one row per JSON object (a custom source's shape)."""
