"""Slack messages -> ``thread``, ``conversation`` and ``burst`` rows, shared by the export and live connectors.

Both Slack connectors (``slack_export``: a workspace export; ``slack``: the Web API and Socket
Mode) read raw Slack message objects, render them with :class:`SlackRenderer` and group one
channel's messages with :func:`channel_rows`:

- ``thread``: a parent message and all its replies (grouped by ``thread_ts``),
  ``external_id = "<channel_id>:<thread_ts>"``;
- ``conversation``: consecutive messages outside threads in one channel, each within
  ``gap_minutes`` of the previous one, ``external_id = "<channel_id>:conv:<first_ts>"``;
- ``burst``: inside a thread or conversation, a run of consecutive messages by one author that
  passes the weighted threshold of ``sources.connectors.slack.distill`` (a rare token, >= 200 characters, or a
  reaction), child of that row (``parent_external_id``), ``external_id =
  "<parent external id>:burst:<first_ts>"``, embedded with the parent's topic prepended.

A thread's embedded text is its distillation (question, summary, resolution, systems, code
references; ``metadata["distilled"]``), see ``sources.connectors.slack.distill``; ``content`` stays the raw
transcript. System noise (joins, leaves, topic/purpose/name changes, pins, integrations) is dropped; file
shares and file comments are kept with the file names. Rows are derived from the messages
alone, so the same messages give the same ids and contents whichever connector read them.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sources.connectors.base import DocumentRow, json_object
from sources.connectors.slack.distill import Distiller, Run, clean_question, cut, distilled_text
from sources.connectors.slack.messages import SlackMessage, transcript_line, ts_datetime, ts_key, valid_ts

TITLE_CHARS = 120
EMBED_CHARS = 1500
TOPIC_CHARS = 160

# Subtypes that record what happened to the channel, not what anyone said. ``file_share``,
# ``file_comment``, ``bot_message``, ``me_message`` and ``thread_broadcast`` carry real content.
NOISE_SUBTYPES = frozenset(
    {
        "channel_join",
        "channel_leave",
        "channel_topic",
        "channel_purpose",
        "channel_name",
        "channel_archive",
        "channel_unarchive",
        "channel_convert_to_private",
        "channel_convert_to_public",
        "group_join",
        "group_leave",
        "group_topic",
        "group_purpose",
        "group_name",
        "group_archive",
        "group_unarchive",
        "pinned_item",
        "unpinned_item",
        "bot_add",
        "bot_remove",
        "bot_enable",
        "bot_disable",
        "app_conversation_join",
        "app_conversation_leave",
        "reminder_add",
        "joiner_notification",
        "sh_room_created",
        "tombstone",
        "message_changed",
        "message_deleted",
        "message_replied",
    }
)

# <@U123>, <@U123|name>, <#C123|general>, <!here>, <!subteam^S1|@team>, <https://x|label>, <mailto:a|a>
MARKUP_RE = re.compile(r"<(?P<body>[@#!][^<>]*|[a-zA-Z][a-zA-Z0-9+.-]*:[^<>\s]*(?:\|[^<>]*)?)>")


@dataclass
class SlackChannel:
    id: str
    name: str
    private: bool
    members: list[str]


def check_workspace_url(value: str | None) -> str | None:
    """A config's ``workspace_url``: blank -> ``None``, else an http(s) URL without a trailing slash.

    Raises ``ValueError`` (pydantic names the field) for any other scheme.
    """
    if value is None or not value.strip():
        return None
    value = value.strip().rstrip("/")
    if not value.startswith(("https://", "http://")):
        raise ValueError("must start with https:// (e.g. https://acme.slack.com)")
    return value


def collect_messages(renderer, raws: list[Any], where: str, report, by_ts: dict[str, SlackMessage]) -> None:
    """Render raw message objects into ``by_ts`` (first one per ``ts`` wins); a non-object or a
    message without a valid ``ts`` is recorded on ``report`` as ``<where>#<index>`` and skipped."""
    for index, raw in enumerate(raws):
        if not isinstance(raw, dict) or not valid_ts(raw.get("ts")):
            report.skip(f"{where}#{index}", "message is not an object with a valid ts")
            continue
        message = renderer.message(raw)
        if message is not None and message.ts not in by_ts:
            by_ts[message.ts] = message


def permalink(workspace_url: str | None, channel_id: str, ts: str) -> str:
    """``<workspace>/archives/<channel>/p<ts digits>``, or a stable ``slack://`` link without a workspace."""
    if workspace_url:
        return f"{workspace_url}/archives/{channel_id}/p{ts.replace('.', '')}"
    return f"slack://channel?id={channel_id}&message={ts}"


def channel_principals(channel: SlackChannel) -> list[str]:
    """Who may read a channel's rows: empty (everyone with the source) for a public channel.

    A private channel lists its members as ``slack:<user id>``; with no member list it gets a
    principal no user holds, so its rows stay closed rather than falling open to the whole source.
    """
    if not channel.private:
        return []
    return [f"slack:{member}" for member in channel.members] or [f"slack-channel:{channel.id}"]


def is_thread(thread_ts: str, group: list[SlackMessage]) -> bool:
    """A ``thread_ts`` group is a thread when it has a reply or its parent declares replies.

    A lone message carrying its own ``thread_ts`` (all replies deleted) is no thread.
    """
    return any(m.ts != thread_ts for m in group) or any(m.declared_replies for m in group)


def channel_rows(
    channel: SlackChannel,
    messages: list[SlackMessage],
    *,
    gap_minutes: int,
    workspace_url: str | None,
    mark_bots: bool = False,
    distiller: Distiller | None = None,
) -> list[DocumentRow]:
    """One channel's rows: a ``thread`` row per thread, ``conversation`` rows for the rest, and
    the ``burst`` rows of each.

    ``messages`` are the channel's kept messages (any order, one per ts). Rows come out in time
    order of their first message (a parent before its bursts). ``mark_bots``: see
    :func:`build_row`. ``distiller``: distils threads and picks bursts (default: rules, no
    source statistics, an LLM when one is configured).
    """
    distiller = distiller or Distiller()
    threads, loose = split_threads(messages)
    rows: list[DocumentRow] = []
    for ts, group in threads:
        rows += thread_rows(channel, ts, group, workspace_url=workspace_url, mark_bots=mark_bots, distiller=distiller)
    for group in group_conversations(loose, gap_seconds=gap_minutes * 60):
        rows += conversation_rows(channel, group, workspace_url=workspace_url, mark_bots=mark_bots, distiller=distiller)
    rows.sort(key=lambda row: (ts_key(row.metadata["first_ts"]), row.external_id))
    return rows


def split_threads(
    messages: list[SlackMessage],
) -> tuple[list[tuple[str, list[SlackMessage]]], list[SlackMessage]]:
    """``(threads, loose)``: ``(thread_ts, messages)`` per thread, and the other messages by time."""
    by_thread: dict[str, list[SlackMessage]] = defaultdict(list)
    for message in messages:
        if message.thread_ts:
            by_thread[message.thread_ts].append(message)
    threads: list[tuple[str, list[SlackMessage]]] = []
    in_threads: set[str] = set()
    for thread_ts, group in by_thread.items():
        if is_thread(thread_ts, group):
            threads.append((thread_ts, group))
            in_threads.update(m.ts for m in group)
    loose = sorted((m for m in messages if m.ts not in in_threads), key=lambda m: ts_key(m.ts))
    return threads, loose


def group_conversations(loose: list[SlackMessage], *, gap_seconds: float) -> list[list[SlackMessage]]:
    """Time-ordered ``loose`` messages cut into runs where each is within ``gap_seconds`` of the last."""
    conversations: list[list[SlackMessage]] = []
    for message in loose:
        if conversations and message.seconds - conversations[-1][-1].seconds <= gap_seconds:
            conversations[-1].append(message)
        else:
            conversations.append([message])
    return conversations


def thread_rows(
    channel: SlackChannel,
    thread_ts: str,
    group: list[SlackMessage],
    *,
    workspace_url: str | None,
    mark_bots: bool = False,
    distiller: Distiller | None = None,
) -> list[DocumentRow]:
    """The ``thread`` row of one thread (parent first, then replies in time order; its text the
    distillation), followed by its ``burst`` rows."""
    distiller = distiller or Distiller()
    parent = next((m for m in group if m.ts == thread_ts), None)
    # Replies can outlive their parent (cut from an export, deleted in Slack): then every message is a reply.
    replies = len(group) - (1 if parent is not None else 0)
    rest = sorted((m for m in group if m is not parent), key=lambda m: ts_key(m.ts))
    ordered = [parent, *rest] if parent is not None else rest
    row = build_row(
        kind="thread",
        external_id=f"{channel.id}:{thread_ts}",
        channel=channel,
        messages=ordered,
        link_ts=thread_ts,
        thread_ts=thread_ts,
        reply_count=replies,
        workspace_url=workspace_url,
        mark_bots=mark_bots,
    )
    distilled = distiller.thread(
        channel_id=channel.id,
        channel=channel.name,
        external_id=row.external_id,
        messages=ordered,
        root=parent,
        transcript=row.content,
    )
    row.text = distilled_text(channel.name, distilled)
    row.metadata["distilled"] = distilled
    topic = cut(distilled["question"].splitlines()[0] if distilled["question"] else "", TOPIC_CHARS)
    runs, burst_meta = distiller.bursts(
        channel_id=channel.id, parent_external_id=row.external_id, messages=ordered, skip_first_run=parent is not None
    )
    row.metadata["bursts"] = burst_meta
    return [row] + [
        burst_row(channel, row, run, topic=topic, position=i, workspace_url=workspace_url, mark_bots=mark_bots)
        for i, run in enumerate(runs)
    ]


def thread_row(
    channel: SlackChannel,
    thread_ts: str,
    group: list[SlackMessage],
    *,
    workspace_url: str | None,
    mark_bots: bool = False,
    distiller: Distiller | None = None,
) -> DocumentRow:
    """The ``thread`` row alone (see :func:`thread_rows`)."""
    return thread_rows(
        channel, thread_ts, group, workspace_url=workspace_url, mark_bots=mark_bots, distiller=distiller
    )[0]


def conversation_rows(
    channel: SlackChannel,
    group: list[SlackMessage],
    *,
    workspace_url: str | None,
    mark_bots: bool = False,
    distiller: Distiller | None = None,
) -> list[DocumentRow]:
    """The ``conversation`` row of consecutive loose messages (``group`` in time order), then its bursts."""
    distiller = distiller or Distiller()
    row = conversation_row(channel, group, workspace_url=workspace_url, mark_bots=mark_bots)
    first_line = next((line for line in group[0].text.splitlines() if line.strip()), group[0].text)
    topic = cut(clean_question(first_line), TOPIC_CHARS)
    runs, burst_meta = distiller.bursts(
        channel_id=channel.id, parent_external_id=row.external_id, messages=group, skip_first_run=False
    )
    row.metadata["bursts"] = burst_meta
    return [row] + [
        burst_row(channel, row, run, topic=topic, position=i, workspace_url=workspace_url, mark_bots=mark_bots)
        for i, run in enumerate(runs)
    ]


def conversation_row(
    channel: SlackChannel, group: list[SlackMessage], *, workspace_url: str | None, mark_bots: bool = False
) -> DocumentRow:
    """The ``conversation`` row of consecutive loose messages (``group`` in time order)."""
    first_ts = group[0].ts
    return build_row(
        kind="conversation",
        external_id=f"{channel.id}:conv:{first_ts}",
        channel=channel,
        messages=group,
        link_ts=first_ts,
        thread_ts=None,
        reply_count=0,
        workspace_url=workspace_url,
        mark_bots=mark_bots,
    )


def burst_row(
    channel: SlackChannel,
    parent: DocumentRow,
    run: Run,
    *,
    topic: str,
    position: int,
    workspace_url: str | None,
    mark_bots: bool = False,
) -> DocumentRow:
    """The ``burst`` row of ``run`` inside ``parent`` (a thread or conversation row).

    ``content`` is the run's transcript; ``text`` (embedded) is ``#channel | topic`` then the
    run's messages as ``Name: text``. ``metadata`` has the channel, ``thread_ts``, ``parent_kind``,
    ``topic``, ``authors`` (the run's author; a bot goes to ``bots`` when ``mark_bots``),
    ``participants`` (author and reactors), ``reactions``, ``burst_message_count`` and
    ``first_ts``/``last_ts``. The link opens the run's first message (in its thread).
    """
    messages = run.messages
    first, last = messages[0], messages[-1]
    author = first.author
    bot = mark_bots and first.bot
    reactions: dict[str, int] = {}
    reactors: set[str] = set()
    for m in messages:
        for name, count, reactor_names in m.reactions:
            reactions[name] = reactions.get(name, 0) + count
            reactors.update(reactor_names)
    people = set() if bot else {author}
    thread_ts = parent.metadata.get("thread_ts")
    url = permalink(workspace_url, channel.id, first.ts)
    if thread_ts and workspace_url and first.ts != thread_ts:
        url += f"?thread_ts={thread_ts}&cid={channel.id}"
    first_line = next((line.strip() for line in first.text.splitlines() if line.strip()), "") or "(no text)"
    body = "\n".join(f"{m.author}: {m.text}" for m in messages)
    metadata: dict[str, Any] = {
        "channel": channel.name,
        "channel_id": channel.id,
        "private": channel.private,
        "thread_ts": thread_ts,
        "parent_kind": parent.kind,
        "topic": topic,
        "authors": sorted(people),
        "participants": sorted(people | reactors, key=str.casefold),
        "reactions": reactions,
        "reaction_count": sum(reactions.values()),
        "burst_message_count": len(messages),
        "first_ts": first.ts,
        "last_ts": last.ts,
    }
    if mark_bots:
        metadata["bots"] = [author] if bot else []
    return DocumentRow(
        external_id=f"{parent.external_id}:burst:{first.ts}",
        kind="burst",
        title=f"#{channel.name}: {cut(first_line, TITLE_CHARS)}",
        content="\n".join(transcript_line(m) for m in messages),
        text=cut(f"#{channel.name} | {topic}\n{body}", EMBED_CHARS),
        url=url,
        path=channel.name,
        position=position,
        parent_external_id=parent.external_id,
        metadata=metadata,
        principals=channel_principals(channel),
        created_at=ts_datetime(first.ts),
        updated_at=ts_datetime(last.ts),
    )


def build_row(
    *,
    kind: str,
    external_id: str,
    channel: SlackChannel,
    messages: list[SlackMessage],
    link_ts: str,
    thread_ts: str | None,
    reply_count: int,
    workspace_url: str | None,
    mark_bots: bool = False,
) -> DocumentRow:
    """A row over ``messages``: transcript as content, participants, reactions, first/last activity.

    ``mark_bots``: integrations' messages stay in the transcript (they carry build results,
    issue comments, evaluations people search for) but their names go to ``metadata["bots"]``
    (with ``bot_message_count``) instead of ``authors``/``participants``, so people rankings
    never credit a bot.
    """
    transcript = "\n".join(transcript_line(m) for m in messages)
    first = messages[0]
    first_line = next((line.strip() for line in first.text.splitlines() if line.strip()), "")
    if not first_line:
        first_line = ", ".join(first.files) or "(no text)"

    authors: list[str] = []
    bots: list[str] = []
    reactors: set[str] = set()
    reactions: dict[str, int] = {}
    files: list[str] = []
    for m in messages:
        people = bots if (mark_bots and m.bot) else authors
        if m.author not in people:
            people.append(m.author)
        for name, count, reactor_names in m.reactions:
            reactions[name] = reactions.get(name, 0) + count
            reactors.update(reactor_names)
        files.extend(f for f in m.files if f not in files)
    # Reacting is taking part, so reactors count as participants but not as authors.
    participants = sorted(set(authors) | reactors, key=str.casefold)
    first_ts = min(messages, key=lambda m: ts_key(m.ts)).ts
    last_ts = max(messages, key=lambda m: ts_key(m.ts)).ts
    metadata: dict[str, Any] = {
        "channel": channel.name,
        "channel_id": channel.id,
        "private": channel.private,
        "thread_ts": thread_ts,
        "participants": participants,
        "authors": authors,
        "message_count": len(messages),
        "reply_count": reply_count,
        "reaction_count": sum(reactions.values()),
        "reactions": reactions,
        "files": files,
        "first_ts": first_ts,
        "last_ts": last_ts,
    }
    if mark_bots:
        metadata["bots"] = sorted(bots, key=str.casefold)
        metadata["bot_message_count"] = sum(1 for m in messages if m.bot)
    return DocumentRow(
        external_id=external_id,
        kind=kind,
        title=f"#{channel.name}: {cut(first_line, TITLE_CHARS)}",
        content=transcript,
        text=f"#{channel.name}\n{cut(transcript, EMBED_CHARS)}",
        url=permalink(workspace_url, channel.id, link_ts),
        path=channel.name,
        metadata=metadata,
        principals=channel_principals(channel),
        created_at=ts_datetime(first_ts),
        updated_at=ts_datetime(last_ts),
    )


class SlackRenderer:
    """Turns raw Slack messages into :class:`SlackMessage` with Slack markup made readable.

    ``<@U1>`` -> ``@Name``, ``<#C1|general>`` -> ``#general``, ``<!here>`` -> ``@here``,
    ``<https://x|label>`` -> ``label (https://x)``, ``<mailto:a@b|a@b>`` -> ``a@b``; the
    ``&amp; &lt; &gt;`` escapes Slack applies to text are undone (after the markup, whose
    labels can contain them). ``users`` maps user ids to names (any mapping with ``get``: the
    live connector looks names up lazily). ``attachment_text``: a message with no text of its
    own (integrations post everything in attachments) takes its attachments' pretext and text.
    """

    def __init__(
        self,
        *,
        users: Mapping[str, str],
        channel_names: Mapping[str, str],
        attachment_text: bool = False,
        own_ids: frozenset[str] = frozenset(),
    ) -> None:
        self.users = users
        self.channel_names = channel_names
        self.attachment_text = attachment_text
        self.own_ids = own_ids  # the app's own user and bot ids: its answers are not knowledge

    def name(self, user_id: str) -> str:
        return self.users.get(user_id) or user_id

    def text(self, raw: str) -> str:
        if "<" not in raw and "&" not in raw:
            return raw
        # Slack escapes exactly these three in message text; html.unescape would also eat "&copy".
        return MARKUP_RE.sub(self._markup, raw).replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")

    def _markup(self, match: re.Match[str]) -> str:
        target, _, label = match.group("body").partition("|")
        if target.startswith("@"):
            user_id = target[1:]
            return "@" + (self.users.get(user_id) or label.lstrip("@") or user_id)
        if target.startswith("#"):
            return "#" + (self.channel_names.get(target[1:]) or label or target[1:])
        if target.startswith("!"):
            # <!here>, <!channel>, <!subteam^S1|@team>, <!date^1392734382^{date}|Feb 18, 2014>
            return label or "@" + target[1:].split("^", 1)[0]
        if target.startswith("mailto:"):
            return label or target[len("mailto:") :]
        if not label or label == target or target.split("://", 1)[-1] == label:
            return target
        return f"{label} ({target})"

    def message(self, raw: dict[str, Any]) -> SlackMessage | None:
        """The rendered message, or ``None`` for system noise and empty messages without files."""
        subtype = raw.get("subtype")
        if subtype in NOISE_SUBTYPES:
            return None
        if self.own_ids and (raw.get("user") in self.own_ids or raw.get("bot_id") in self.own_ids):
            return None  # the portal's own answers (the Slack bot): citing them would cite itself
        files = file_names(raw)
        text = str(raw.get("text") or "")
        user_id = raw.get("user")
        comment = raw.get("comment") if isinstance(raw.get("comment"), dict) else None
        if subtype == "file_comment" and comment is not None:
            # The export's text is "<@U1> commented on U2's file <url|name>: ..."; the comment
            # itself with the file's name reads better in a transcript.
            user_id = comment.get("user") or user_id
            text = f"[comment on {', '.join(files) or 'a file'}] {comment.get('comment') or ''}".rstrip()
        rendered = self.text(text).strip()
        initial = (raw.get("file") or {}).get("initial_comment") if isinstance(raw.get("file"), dict) else None
        if isinstance(initial, dict) and initial.get("comment"):
            rendered = f"{rendered}\n{self.text(str(initial['comment'])).strip()}".strip()
        attachments = [a for a in raw.get("attachments") or [] if isinstance(a, dict)]
        if self.attachment_text and not rendered:
            parts: list[str] = []
            for attachment in attachments:
                body = [str(attachment.get(k) or "").strip() for k in ("pretext", "title", "text")]
                body = [b for b in body if b] or [str(attachment.get("fallback") or "").strip()]
                parts.extend(self.text(b).strip() for b in body if b)
            rendered = "\n".join(p for p in parts if p)
        # A bare shared link says little; its unfurled title ("Houston Data Visualization Meetup")
        # is what people search for. The unfurl's body text is left out: long and often stale.
        for attachment in attachments:
            title = attachment.get("title")
            if title and str(title) not in rendered:
                rendered = f"{rendered} [link: {self.text(str(title)).strip()}]".strip()
        missing = [f for f in files if f not in rendered]
        if missing:
            rendered = f"{rendered} [file: {', '.join(missing)}]".strip()
        if not rendered:
            return None
        bot = subtype == "bot_message" or (not user_id and bool(raw.get("bot_id")))
        if user_id:
            author = self.name(str(user_id))
        else:
            # Integrations post without a user: the bot's display name, else its id.
            profile = json_object(raw.get("bot_profile"))
            author = self.text(str(raw.get("username") or profile.get("name") or raw.get("bot_id") or "unknown"))
            author = author.lstrip("@")
        reactions = []
        for reaction in raw.get("reactions") or []:
            if not isinstance(reaction, dict) or not reaction.get("name"):
                continue
            reactors = [self.name(str(u)) for u in reaction.get("users") or []]
            count = reaction.get("count")
            reactions.append((str(reaction["name"]), int(count) if isinstance(count, int) else len(reactors), reactors))
        ts = str(raw["ts"])
        thread_ts = raw.get("thread_ts")
        return SlackMessage(
            ts=ts,
            seconds=float(ts),
            author=author,
            text=rendered,
            thread_ts=str(thread_ts) if valid_ts(thread_ts) else None,
            declared_replies=raw["reply_count"] if isinstance(raw.get("reply_count"), int) else 0,
            files=files,
            reactions=reactions,
            bot=bot,
        )


def file_names(raw: dict[str, Any]) -> list[str]:
    """Names of the files a message shares: old exports have ``file``, newer ones ``files``."""
    candidates = list(raw.get("files") or [])
    if isinstance(raw.get("file"), dict):
        candidates.insert(0, raw["file"])
    names: list[str] = []
    for entry in candidates:
        # Deleted or over-quota files ("tombstone", "hidden_by_limit") keep no name.
        name = entry.get("name") or entry.get("title") if isinstance(entry, dict) else None
        if name and str(name) not in names:
            names.append(str(name))
    return names
