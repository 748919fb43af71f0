"""Who may read a Jira issue that has a security level: its level's members, read from Jira.

Jira's REST API (v2 and v3 alike) exposes a level's members as permission holders:

- ``GET {api}/issuesecurityschemes/level/member?levelId=<id>&expand=user,group,projectRole``
  (paged by ``startAt``/``maxResults`` until ``isLast``; needs the *Administer Jira* global
  permission), each value's ``holder`` a ``{"type", "parameter", "user"?, "group"?}``;
- ``GET {api}/project/{key}/role/{id}`` for a ``projectRole`` holder: the role's ``actors``
  (``atlassian-user-role-actor`` with ``actorUser.accountId``, ``atlassian-group-role-actor``
  with ``actorGroup.name``) in the issue's project;
- ``GET {api}/group/member?groupname=<name>`` (paged, ``values``/``isLast``) for each group a
  level or one of its roles names.

An issue at a level carries one principal for the level, ``jira-level:<site host>/<level id>``
(one Jira site's level 10200 is not another's), plus its own reporter or assignee when the
level names them. The level is stored as a group (``sources.models.ExternalGroup``) whose
members are the people it admits, flattened: its users, the members of its groups, the users
and group members of its project roles (roles are per project, so a level whose role differs
between projects gets one group per project: ``.../<level id>@<project>``). A user is
``jira:<accountId>`` (Server: its ``key``, else ``name``), stored as an identity with the email
Jira shows for it, so a portal user with that verified address holds it.

Every run, incremental ones included, reads every level this run's issues name and every level
the source stored before, and replaces their member lists: removal from a level, a group or a
role takes effect at the next sync although no issue changed.

Fail closed: a holder type that names no list of people (``anyone``, ``applicationRole``,
``projectLead``, custom-field holders) admits nobody; a level, role or group Jira will not
show (HTTP 400/403/404: the credential lacks the permission) admits nobody through it, each
recorded once as a skip with the reason. A level listed in the source's ``security_principals``
is taken from there, unread. Paging that does not advance, or runs past ``MAX_PAGES``, fails
the run.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from kbportal.emails import email_key
from sources.connectors.atlassian.client import AtlassianClient, AtlassianError
from sources.connectors.base import Directory, IngestReport

# Statuses that mean "Jira will not show this to the credential" (or the object is gone): the
# holder admits nobody. Anything else (401, 5xx, rate limits) fails the run as any REST error.
_NOT_SHOWN = (400, 403, 404)
_PAGE = 50
MAX_PAGES = 2000  # 100,000 holders or group members: an answer that pages on past this is refused
LEVEL_PREFIX = "jira-level:"


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def user_principal(user: Any, directory: Directory) -> str:
    """The principal of a Jira user object (``jira:<accountId>``, Server's ``jira:<key>`` or
    ``jira:<name>``, or ``email:<address>`` when it has only an address); ``""`` for none.
    Records the person in ``directory`` under that principal, with the email Jira shows (so a
    verified address links it), and under ``email:<address>`` too when there is one. Addresses
    are compared as ``kbportal.emails.email_key`` folds them (ASCII case only)."""
    if not isinstance(user, dict):
        return ""
    email = email_key(str(user.get("emailAddress") or ""))
    ident = str(user.get("accountId") or user.get("key") or user.get("name") or "").strip()
    name = str(user.get("displayName") or "").strip()
    if email:
        directory.person(f"email:{email}", email=email, name=name)
    if ident:
        directory.person(f"jira:{ident}", email=email, name=name)
        return f"jira:{ident}"
    return f"email:{email}" if email else ""


def level_principal(base_url: str, level_id: str, project: str = "") -> str:
    """``jira-level:<host>/<level id>`` (``@<project>`` when its roles make it per project)."""
    host = (urlsplit(base_url).netloc or base_url).lower()
    return f"{LEVEL_PREFIX}{host}/{level_id}" + (f"@{project}" if project else "")


class SecurityLevels:
    """Reads, once per run and level, who holds each security level (see the module docstring).

    ``api`` is the REST root (``/rest/api/2``), ``base_url`` the site (it names the level
    principals); ``report`` receives one skip per level, role or group that could not be read.
    :meth:`principals` is called per issue; :meth:`finish` once at the end of the run, with the
    level principals the source stored before.
    """

    def __init__(
        self, client: AtlassianClient, api: str, base_url: str, directory: Directory, report: IngestReport
    ) -> None:
        self.client = client
        self.api = api
        self.base_url = base_url
        self.directory = directory
        self.report = report
        self._levels: dict[str, tuple[str, list[dict[str, Any]] | None]] = {}  # id -> (name, holders)
        self._roles: dict[tuple[str, str], set[str]] = {}
        self._groups: dict[str, set[str]] = {}
        self._stored: dict[str, set[str]] = {}  # level principal -> members, for this run's directory
        self._noted: set[tuple[str, str]] = set()  # (item, reason kind) already recorded as skipped

    def principals(
        self, *, level_id: str, level_name: str, project: str, reporter: str = "", assignee: str = ""
    ) -> list[str]:
        """Sorted principals of one issue at level ``level_id`` in ``project`` (its key):
        the level's (whose members :meth:`finish` stores) and the issue's ``reporter`` or
        ``assignee`` principal when the level names that holder."""
        holders = self._level(level_id, level_name)
        per_project = any(str(h.get("type")) == "projectRole" for h in holders or [])
        principal = level_principal(self.base_url, level_id, project if per_project else "")
        if principal not in self._stored:
            self._stored[principal] = self._members(holders or [], project, level_name or level_id)
        found = {principal}
        kinds = {str(h.get("type") or "") for h in holders or []}
        if "reporter" in kinds and reporter:
            found.add(reporter)
        if "assignee" in kinds and assignee:
            found.add(assignee)
        return sorted(found)

    def finish(self, stored_before: set[str]) -> None:
        """Put every level group of this run in ``directory``, after reading again the levels
        the source stored before (``stored_before``: their principals) that no issue of this run
        named, so each run replaces every level's member list."""
        mine = level_principal(self.base_url, "")
        for principal in sorted(stored_before - set(self._stored)):
            if not principal.startswith(mine):
                continue  # another site's (the source's base_url changed): dropped on a full run
            level_id, _, project = principal[len(mine) :].partition("@")
            holders = self._level(level_id, "")
            self._stored[principal] = self._members(holders or [], project, level_id)
        for principal, members in self._stored.items():
            level_id = principal[len(mine) :].partition("@")[0]
            name = self._levels.get(level_id, ("", None))[0] or level_id
            self.directory.group(principal, name=f"Jira security level {name}")
            self.directory.groups[principal].members = set(members)

    # -- reads ---------------------------------------------------------------------------------

    def _members(self, holders: list[dict[str, Any]], project: str, label: str) -> set[str]:
        """The people ``holders`` admit in ``project``, flattened (groups and roles read)."""
        people: set[str] = set()
        for holder in holders:
            kind = str(holder.get("type") or "")
            parameter = str(holder.get("parameter") or holder.get("value") or "").strip()
            if kind == "user":
                people.add(user_principal(_object(holder.get("user")) or {"accountId": parameter}, self.directory))
            elif kind == "group":
                people |= self._group(str(_object(holder.get("group")).get("name") or parameter))
            elif kind == "projectRole" and project and parameter:
                people |= self._role(project, parameter)
            elif kind not in ("reporter", "assignee"):  # those are per issue (principals)
                self._skip(
                    f"security level {label}",
                    f"its holder of type {kind or 'unknown'!r} names no list of people; nobody is let in through it",
                )
        return people - {""}

    def _level(self, level_id: str, level_name: str) -> list[dict[str, Any]] | None:
        if level_id in self._levels:
            return self._levels[level_id][1]
        holders: list[dict[str, Any]] | None = []
        try:
            params = {"levelId": level_id, "expand": "user,group,projectRole"}
            for member in self._paged(f"{self.api}/issuesecurityschemes/level/member", params):
                if isinstance(member, dict) and str(member.get("issueSecurityLevelId", level_id)) == level_id:
                    holder = member.get("holder")
                    if isinstance(holder, dict) and holders is not None:
                        holders.append(holder)
        except AtlassianError as exc:
            holders = None
            self._refused(
                exc,
                f"security level {level_name or level_id}",
                "Jira shows them to the Administer Jira permission; its issues stay closed to everyone unless "
                "security_principals lists the level",
            )
        self._levels[level_id] = (level_name, holders)
        return holders

    def _role(self, project: str, role_id: str) -> set[str]:
        key = (project, role_id)
        if key in self._roles:
            return self._roles[key]
        people: set[str] = set()
        try:
            role = self.client.get_json(f"{self.api}/project/{project}/role/{role_id}")
        except AtlassianError as exc:
            role = None
            self._refused(exc, f"project role {role_id} of {project}", "nobody is let in through it")
        actors = role.get("actors") if isinstance(role, dict) else None
        for actor in actors if isinstance(actors, list) else []:
            if not isinstance(actor, dict):
                continue
            kind = str(actor.get("type") or "")
            if kind == "atlassian-user-role-actor":
                user = _object(actor.get("actorUser")) or {"name": actor.get("name")}
                people.add(user_principal({**user, "displayName": actor.get("displayName")}, self.directory))
            elif kind == "atlassian-group-role-actor":
                people |= self._group(str(_object(actor.get("actorGroup")).get("name") or actor.get("name") or ""))
        self._roles[key] = people - {""}
        return self._roles[key]

    def _group(self, name: str) -> set[str]:
        """The members of the Jira group ``name`` (empty for a blank name or one Jira will not show)."""
        name = name.strip()
        if not name:
            return set()
        if name in self._groups:
            return self._groups[name]
        members: set[str] = set()
        try:
            for user in self._paged(f"{self.api}/group/member", {"groupname": name}):
                members.add(user_principal(user, self.directory))
        except AtlassianError as exc:
            members = set()
            self._refused(exc, f"group {name}", "nobody is let in through it")
        self._groups[name] = members - {""}
        return self._groups[name]

    def _paged(self, path: str, params: dict[str, Any]) -> Iterator[Any]:
        """Every ``values`` item of a paged Jira answer (``startAt`` until ``isLast`` or ``total``).
        Raises ``AtlassianError`` (status 0) on an answer without ``values`` or paging past
        ``MAX_PAGES``."""
        start = 0
        for _ in range(MAX_PAGES):
            page = self.client.get_json(path, {**params, "startAt": start, "maxResults": _PAGE})
            values = page.get("values") if isinstance(page, dict) else None
            if not isinstance(values, list):
                raise AtlassianError(f"Jira {path}: expected an object with 'values'")
            yield from values
            start += len(values)
            total = page.get("total")
            if not values or page.get("isLast") is True or (isinstance(total, int) and start >= total):
                return
        raise AtlassianError(f"Jira {path}: still paging after {MAX_PAGES} pages; refusing to read on")

    def _refused(self, exc: AtlassianError, item: str, consequence: str) -> None:
        """Record that Jira would not show ``item``'s members (re-raises ``exc`` unless its status
        is one of ``_NOT_SHOWN``: any other failure fails the run)."""
        if exc.status not in _NOT_SHOWN:
            raise exc
        self._skip(item, f"its members could not be read (HTTP {exc.status}); {consequence}")

    def _skip(self, item: str, reason: str) -> None:
        if (item, reason) not in self._noted:
            self._noted.add((item, reason))
            self.report.skip(item, reason)
