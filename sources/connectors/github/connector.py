"""GitHub issues and pull requests, read through the REST API -> ``ticket`` and ``pr`` rows.

Calls (all paginated by ``Link`` headers, see :mod:`.client`):

- ``GET /repos/{owner}/{repo}/issues?state=all&sort=updated&direction=asc&since=...``: issues
  and pull requests together; an item with a ``pull_request`` key is a pull request (its
  ``merged_at`` is there too);
- ``GET /repos/{owner}/{repo}/issues/{n}/comments`` when the item has ``comments``;
- for pull requests, ``GET /repos/{owner}/{repo}/pulls/{n}/reviews`` and
  ``GET /repos/{owner}/{repo}/pulls/{n}/comments`` (review comments on the diff).

One row per item, ``external_id`` ``owner/repo#number``: kind ``pr`` for a pull request (so
``recent_prs`` and the history intent find it) and ``ticket`` for an issue (the table's kind
for issues and tickets; an ``issue`` kind would be unknown to the API's kind filter). Content is
the title, the body, then every comment, review and review comment as ``login (YYYY-MM-DD):
text`` lines in time order. Metadata: ``repo``, ``number``, ``type`` (``issue`` |
``pull_request``), ``state``, ``author`` (the opener's login), ``assignees``, ``labels``,
``commenters`` and ``reviewers`` (other people's logins, first appearance order; who_knows
credits ``author`` in full and these two at half weight), ``created_at``, ``updated_at``,
``closed_at`` and, for pull requests, ``merged_at``, ``draft`` and ``pr_number``. The row's
``updated_at`` is the item's ``updated_at`` (GitHub bumps it on comments and reviews).

Incremental runs: the ingestion service hands :meth:`GitHubConnector.resume_from` the newest
``updated_at`` among the source's stored rows (the cursor). Items are listed oldest update
first, so a run that stops half-way has stored a prefix and the cursor stays right.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from sources.connectors.base import Connector, DocumentRow, IngestReport
from sources.connectors.github.client import GitHubClient, GitHubError
from sources.connectors.github.config import GitHubConfig


class GitHubConnector(Connector):
    """Rows from GitHub's REST API; see the module docstring for the calls and row shapes."""

    kind = "github"
    config_model = GitHubConfig
    config: GitHubConfig

    def __init__(self, config: dict[str, Any], *, include=None, exclude=None) -> None:
        super().__init__(config, include=include, exclude=exclude)
        self._client: GitHubClient | None = None
        self.since: datetime | None = self.config.since

    @property
    def client(self) -> GitHubClient:
        if self._client is None:
            token = self.config.token.get_secret_value() if self.config.token is not None else None
            self._client = GitHubClient(
                base_url=self.config.base_url,
                token=token,
                page_size=self.config.page_size,
                max_wait_seconds=self.config.max_rate_limit_wait_seconds,
                retries=self.config.rate_limit_retries,
            )
        return self._client

    @property
    def repo_path(self) -> str:
        return f"/repos/{self.config.owner}/{self.config.repo}"

    def resume_from(self, cursor: datetime | None) -> bool:
        """Take the source's cursor (the newest stored row's ``updated_at``, ``None`` when it has
        none); returns true when this run reads only what changed, so rows it does not yield
        must be kept. The run asks for items updated at or after the later of ``config.since``
        and (when ``incremental``) the cursor; GitHub's ``since`` is inclusive, so items at the
        cursor come again and are found unchanged by their hash.
        """
        since = self.config.since
        if self.config.incremental and cursor is not None:
            since = cursor if since is None else max(since, cursor)
        self.since = since
        return since is not None

    def iter_rows(self, report: IngestReport) -> Iterator[DocumentRow]:
        """Yield one row per issue and pull request, least recently updated first.

        An item whose comments or reviews answer 404/410 (deleted or moved while the run read
        it) is ``report.skip``-ped. Anything else that fails (bad token, missing repository,
        rate limit beyond the allowed wait, network) raises ``ConnectorError`` with the token
        redacted: the run fails and earlier rows stay.
        """
        if not (self.config.include_issues or self.config.include_pull_requests):
            return
        params: dict[str, Any] = {"state": "all", "sort": "updated", "direction": "asc"}
        if self.since is not None:
            params["since"] = _iso(self.since)
        seen: set[int] = set()
        for item in self.client.pages(f"{self.repo_path}/issues", **params):
            number = int(item["number"])
            is_pr = "pull_request" in item
            # An item updated while the run pages moves to the end of the list and comes twice.
            if number in seen or not (self.config.include_pull_requests if is_pr else self.config.include_issues):
                continue
            seen.add(number)
            try:
                row = self._row(item, is_pr=is_pr)
            except GitHubError as exc:
                if exc.status not in (404, 410):
                    raise
                report.skip(f"#{number}", f"GitHub answered HTTP {exc.status} for its comments or reviews")
                report.advance()
                continue
            report.advance()
            for login in (
                row.metadata.get("author"),
                *row.metadata.get("commenters", []),
                *row.metadata.get("reviewers", []),
            ):
                if login:  # GitHub shows no emails here: listed, linked to nobody
                    self.directory.person(f"github:{login}", name=str(login))
            yield row

    def _row(self, item: dict[str, Any], *, is_pr: bool) -> DocumentRow:
        number = int(item["number"])
        author = _login(item.get("user"))
        entries: list[tuple[str, str, str]] = []  # (iso time, login, line)
        commenters: list[str] = []
        reviewers: list[str] = []
        if item.get("comments"):
            for comment in self.client.pages(f"{self.repo_path}/issues/{number}/comments"):
                login = _login(comment.get("user"))
                entries.append(
                    (
                        comment.get("created_at") or "",
                        login,
                        _line(login, comment.get("created_at"), comment.get("body")),
                    )
                )
                commenters.append(login)
        if is_pr:
            for review in self.client.pages(f"{self.repo_path}/pulls/{number}/reviews"):
                state = str(review.get("state") or "")
                if state == "PENDING":  # not submitted: nobody else can see it
                    continue
                login = _login(review.get("user"))
                when = review.get("submitted_at") or ""
                text = f"{state.lower().replace('_', ' ')}: {review.get('body') or ''}".strip().rstrip(":")
                entries.append((when, login, _line(login, when, text)))
                reviewers.append(login)
            for comment in self.client.pages(f"{self.repo_path}/pulls/{number}/comments"):
                login = _login(comment.get("user"))
                where = comment.get("path") or ""
                body = f"on {where}: {comment.get('body') or ''}" if where else comment.get("body")
                entries.append((comment.get("created_at") or "", login, _line(login, comment.get("created_at"), body)))
                commenters.append(login)
        entries.sort(key=lambda e: e[0])
        title = str(item.get("title") or "").strip()
        body = str(item.get("body") or "").strip()
        content = "\n\n".join(part for part in (title, body, "\n".join(e[2] for e in entries)) if part)
        metadata: dict[str, Any] = {
            "repo": f"{self.config.owner}/{self.config.repo}",
            "number": number,
            "type": "pull_request" if is_pr else "issue",
            "state": item.get("state") or "",
            "author": author,
            "assignees": _unique(_login(a) for a in item.get("assignees") or []),
            "labels": _unique(
                str(label.get("name") or "") for label in item.get("labels") or [] if isinstance(label, dict)
            ),
            "commenters": _unique(c for c in commenters if c != author),
            "reviewers": _unique(r for r in reviewers if r != author),
            "created_at": item.get("created_at"),
            "updated_at": item.get("updated_at"),
            "closed_at": item.get("closed_at"),
        }
        if is_pr:
            metadata["pr_number"] = number
            metadata["merged_at"] = (item.get("pull_request") or {}).get("merged_at")
            metadata["draft"] = bool(item.get("draft"))
        return DocumentRow(
            external_id=f"{self.config.owner}/{self.config.repo}#{number}",
            kind="pr" if is_pr else "ticket",
            title=f"#{number} {title}",
            content=content,
            url=str(item.get("html_url") or ""),
            metadata=metadata,
            created_at=_parse(item.get("created_at")),
            updated_at=_parse(item.get("updated_at")),
        )


def _login(user: Any) -> str:
    return str(user.get("login") or "") if isinstance(user, dict) else ""


def _line(login: str, when: str | None, text: Any) -> str:
    day = (when or "")[:10] or "undated"
    return f"{login or 'ghost'} ({day}): {' '.join(str(text or '').split())}"


def _unique(values: Any) -> list[str]:
    return [v for v in dict.fromkeys(values) if v]


def _parse(value: Any) -> datetime | None:
    """A datetime from GitHub's ``2024-01-31T12:00:00Z``; ``None`` for a missing or bad value."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None


def _iso(value: datetime) -> str:
    """``2024-01-31T12:00:00Z`` (UTC, seconds floored: ``since`` is inclusive, so nothing is missed)."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
