"""GitHub issues and pull requests through the REST API (kind ``github``)."""
