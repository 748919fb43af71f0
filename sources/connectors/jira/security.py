"""Who may read a Jira issue that has a security level: its level's members, read from Jira.

Jira's REST API (v2 and v3 alike) exposes a level's members as permission holders:

- ``GET {api}/issuesecurityschemes/level/member?levelId=<id>&expand=user,group,projectRole``
  (paged by ``startAt``/``maxResults`` until ``isLast``; needs the *Administer Jira* global
  permission), each value's ``holder`` a ``{"type", "parameter", "user"?, "group"?}``;
- ``GET {api}/project/{key}/role/{id}`` for a ``projectRole`` holder: the role's ``actors``
  (``atlassian-user-role-actor`` with ``actorUser.accountId``, ``atlassian-group-role-actor``
  with ``actorGroup.name``) in the issue's project;
- ``GET {api}/group/member?groupname=<name>`` (paged, ``values``/``isLast``) for each group a
  level or role names, so ``group:<name>`` is stored with its members
  (``sources.models.ExternalGroup``).

Holders become ``Document.principals``: a user ``jira:<accountId>`` (Server: its ``name``), a
group ``group:<name>`` (the principal Confluence uses for the same site's groups), ``reporter``
and ``assignee`` the issue's own. The identity ``jira:<accountId>`` is stored with the email
Jira shows for it, so a portal user with that verified address holds it.

Fail closed: a holder type that names no list of people (``anyone``, ``applicationRole``,
``projectLead``, custom-field holders) admits nobody; a level, role or group Jira will not
show (HTTP 400/403/404: the credential lacks the permission) admits nobody through it, and
each is recorded once as a skip with the reason. A level listed in the source's
``security_principals`` is taken from there, unread.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sources.connectors.atlassian.client import AtlassianClient, AtlassianError
from sources.connectors.base import Directory, IngestReport

# Statuses that mean "Jira will not show this to the credential" (or the object is gone): the
# holder admits nobody. Anything else (401, 5xx, rate limits) fails the run as any REST error.
_NOT_SHOWN = (400, 403, 404)
_PAGE = 50


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def user_principal(user: Any, directory: Directory) -> str:
    """The principal of a Jira user object (``jira:<accountId>``, Server's ``jira:<name>``, or
    ``email:<address>`` when it has only an address); ``""`` for none. Records the person in
    ``directory`` under that principal, with the email Jira shows (so a verified address links
    it), and under ``email:<address>`` too when there is one."""
    if not isinstance(user, dict):
        return ""
    email = str(user.get("emailAddress") or "").strip()
    ident = str(user.get("accountId") or user.get("name") or user.get("key") or "").strip()
    name = str(user.get("displayName") or "").strip()
    if email:
        directory.person(f"email:{email.lower()}", email=email, name=name)
    if ident:
        directory.person(f"jira:{ident}", email=email, name=name)
        return f"jira:{ident}"
    return f"email:{email.lower()}" if email else ""


class SecurityLevels:
    """Reads, once per run and level, who holds each security level (see the module docstring).

    ``api`` is the REST root (``/rest/api/2``); ``report`` receives one skip per level, role or
    group that could not be read. :meth:`principals` is called per issue; :meth:`read_groups`
    once at the end of the run.
    """

    def __init__(self, client: AtlassianClient, api: str, directory: Directory, report: IngestReport) -> None:
        self.client = client
        self.api = api
        self.directory = directory
        self.report = report
        self._levels: dict[str, list[dict[str, Any]] | None] = {}
        self._roles: dict[tuple[str, str], set[str]] = {}
        self._groups: set[str] = set()
        self._noted: set[tuple[str, str]] = set()  # (level, holder type) already recorded as skipped

    def principals(
        self, *, level_id: str, level_name: str, project: str, reporter: str = "", assignee: str = ""
    ) -> list[str]:
        """Sorted principals of one issue at level ``level_id`` in ``project`` (its key);
        ``reporter``/``assignee`` are the issue's user principals. Empty when nobody can be
        named: the caller then closes the issue."""
        holders = self._level(level_id, level_name)
        found: set[str] = set()
        unread: set[str] = set()
        for holder in holders or []:
            kind = str(holder.get("type") or "")
            parameter = str(holder.get("parameter") or holder.get("value") or "").strip()
            if kind == "user":
                user = holder.get("user") if isinstance(holder.get("user"), dict) else {"accountId": parameter}
                found.add(user_principal(user, self.directory))
            elif kind == "group":
                group = _object(holder.get("group"))
                found.add(self._group(str(group.get("name") or parameter)))
            elif kind == "projectRole" and project and parameter:
                found |= self._role(project, parameter)
            elif kind == "reporter":
                found.add(reporter)
            elif kind == "assignee":
                found.add(assignee)
            else:
                unread.add(kind or "unknown")
        key = f"security level {level_name or level_id}"
        for kind in sorted(unread):
            if (key, kind) in self._noted:
                continue
            self._noted.add((key, kind))
            self.report.skip(key, f"its holder of type {kind!r} names no list of people; nobody is let in through it")
        return sorted(p for p in found if p and p != "group:")

    def read_groups(self) -> None:
        """Read the members of every group a level or role named into ``directory``. A group
        Jira will not show is kept with no members and recorded as a skip."""
        for name in sorted(self._groups):
            principal = f"group:{name}"
            members: set[str] = set()
            try:
                for user in self._paged(f"{self.api}/group/member", {"groupname": name}):
                    members.add(user_principal(user, self.directory))
            except AtlassianError as exc:
                if exc.status not in _NOT_SHOWN:
                    raise
                self.directory.group(principal, name=name)
                self.directory.groups[principal].members.clear()
                self.report.skip(
                    principal, f"its members could not be read (HTTP {exc.status}); nobody is taken to be in it"
                )
                continue
            self.directory.group(principal, name=name, members=members - {""})

    # -- reads ---------------------------------------------------------------------------------

    def _level(self, level_id: str, level_name: str) -> list[dict[str, Any]] | None:
        if level_id in self._levels:
            return self._levels[level_id]
        holders: list[dict[str, Any]] | None = []
        try:
            params = {"levelId": level_id, "expand": "user,group,projectRole"}
            for member in self._paged(f"{self.api}/issuesecurityschemes/level/member", params):
                if isinstance(member, dict) and str(member.get("issueSecurityLevelId", level_id)) == level_id:
                    holder = member.get("holder")
                    if isinstance(holder, dict) and holders is not None:
                        holders.append(holder)
        except AtlassianError as exc:
            if exc.status not in _NOT_SHOWN:
                raise
            holders = None
            self.report.skip(
                f"security level {level_name or level_id}",
                f"its members could not be read (HTTP {exc.status}; Jira shows them to the Administer Jira "
                "permission); its issues stay closed to everyone unless security_principals lists the level",
            )
        self._levels[level_id] = holders
        return holders

    def _role(self, project: str, role_id: str) -> set[str]:
        key = (project, role_id)
        if key in self._roles:
            return self._roles[key]
        people: set[str] = set()
        try:
            role = self.client.get_json(f"{self.api}/project/{project}/role/{role_id}")
        except AtlassianError as exc:
            if exc.status not in _NOT_SHOWN:
                raise
            role = None
            self.report.skip(
                f"project role {role_id} of {project}",
                f"its members could not be read (HTTP {exc.status}); nobody is let in through it",
            )
        actors = role.get("actors") if isinstance(role, dict) else None
        for actor in actors if isinstance(actors, list) else []:
            if not isinstance(actor, dict):
                continue
            kind = str(actor.get("type") or "")
            if kind == "atlassian-user-role-actor":
                user = _object(actor.get("actorUser")) or {"name": actor.get("name")}
                people.add(user_principal({**user, "displayName": actor.get("displayName")}, self.directory))
            elif kind == "atlassian-group-role-actor":
                group = _object(actor.get("actorGroup"))
                people.add(self._group(str(group.get("name") or actor.get("name") or "")))
        self._roles[key] = people - {"", "group:"}
        return self._roles[key]

    def _group(self, name: str) -> str:
        name = name.strip()
        if name:
            self._groups.add(name)
        return f"group:{name}"

    def _paged(self, path: str, params: dict[str, Any]) -> Iterator[Any]:
        """Every ``values`` item of a paged Jira answer (``startAt`` until ``isLast`` or ``total``)."""
        start = 0
        while True:
            page = self.client.get_json(path, {**params, "startAt": start, "maxResults": _PAGE})
            values = page.get("values") if isinstance(page, dict) else None
            if not isinstance(values, list):
                raise AtlassianError(f"Jira {path}: expected an object with 'values'")
            yield from values
            start += len(values)
            total = page.get("total")
            if not values or page.get("isLast") is True or (isinstance(total, int) and start >= total):
                return
