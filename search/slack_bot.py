"""The Slack bot: answers where people already ask, on the same Socket Mode connection as ingestion.

``manage.py slack_listen --answer`` hands the events it is not ingesting to :class:`SlackBot`:

- ``app_mention`` in a channel, or a direct ``message`` to the app (``channel_type`` ``im``):
  the question (mentions of the app removed) is answered **in the thread** with
  ``chat.postMessage``, its ``[n]`` citations linked to their sources as Slack links and the
  sources listed below. A follow-up in the same thread continues the asker's conversation
  (``search.pipeline.followup``): each Slack thread and asker is one ``Conversation``.
- The Slack user is mapped to a portal user through the organization's identities: the
  source's ``ExternalIdentity`` ``slack:<user id>`` carries the address Slack reports, and the
  portal user is the member of this organization who has verified that address
  (``allauth``). So the Slack workspace's admins, who can set profile addresses, are trusted
  as much as the portal's own sign-in. A Slack user with no linked account gets a reply saying
  how to link one, and nothing else.
- **What an answer may show depends on who can see it.** In a direct message, only the asker:
  the answer runs as that member, in their default project, with their permissions. In a
  channel, everyone in it (guests and other organizations' people included) reads the reply:
  the answer runs in the asker's default project only when every member of the organization
  may read that project, and only over rows restricted to nobody (no ``principals``); else the
  reply asks for a direct message. Questions count against the asker's ``KB_ASK_RATE``, as on
  the web page.
- ``reaction_added`` with 👍 (``+1``, ``thumbsup``) or 👎 (``-1``, ``thumbsdown``) on the bot's
  answer records the asker's vote (``search.services.answer_feedback_submit``; anyone else's
  reaction is ignored).
- A verified answer to the same question (``search.verified``), when the reply's readers may see
  it, comes first, marked with who verified it and when.

Each event id is applied once (``sources.services.slack_event_claim``, the listener's durable
guard; released when the reply could not be posted, so Slack's redelivery is answered). Slack's
Web API is reached through ``slack_sdk.WebClient`` on the source's ``base_url`` (with retries on
rate limits and connection errors: the listener builds it). The app's own messages are not
ingested (``SlackRenderer.own_ids``): the portal never cites its earlier answers.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from allauth.account.models import EmailAddress
from django.conf import settings
from django.db import IntegrityError
from django.http import HttpRequest
from django_ratelimit.core import get_usage

from kbportal.emails import email_key
from kbportal.tenancy import tenant_context
from projects.models import Project
from projects.selectors import ScopeNotFound, membership_list_for_user
from search.models import AnswerRecord, Conversation, SlackAnswer
from search.rendering import answer_terminal_text
from search.retrieval import InvalidQuery, clean_query
from search.services import AnswerNotFound, answer_feedback_submit, ask
from sources.models import ExternalIdentity
from sources.selectors import scope_for_user
from sources.services import slack_event_claim, slack_event_release

logger = logging.getLogger(__name__)

UP_REACTIONS = frozenset({"+1", "thumbsup"})
DOWN_REACTIONS = frozenset({"-1", "thumbsdown"})
SLACK_TEXT_CHARS = 3900  # chat.postMessage truncates text past 40,000; a readable answer stays far under
_MENTION = re.compile(r"<@[UW][A-Z0-9]+(?:\|[^>]*)?>")
_CITATION = re.compile(r"\[(\d{1,3})\]")

LINK_HELP = (
    "I can't tell who you are in kbportal yet, so I can't answer with your permissions. "
    "Sign in to kbportal with the email address of your Slack profile and verify it; "
    "once your organization's Slack source has synced, mention me again."
)
NO_PROJECT = "You have no project in kbportal yet: open kbportal once to choose your default project, then ask again."
ASK_PRIVATELY = (
    "Your default project in kbportal is not open to everyone in the organization, so I won't answer "
    "from it where others can read. Ask me in a direct message."
)
_SLACK_MARKUP = re.compile(r"<([^<>\n]{1,500})>")
_LINK_SAFE = ":/?#[]@!$&'()*+,;=%~-._"  # RFC 3986 reserved and unreserved characters stay; <, >, |, spaces do not


@dataclass(frozen=True)
class SlackQuestion:
    """A question asked of the bot: ``ts`` the message, ``thread_ts`` the thread to answer in."""

    event_id: str
    channel: str
    user: str
    text: str
    ts: str
    thread_ts: str


@dataclass(frozen=True)
class SlackReaction:
    """A vote on one of the bot's messages (``vote`` +1 or -1)."""

    event_id: str
    channel: str
    user: str
    ts: str
    vote: int


def parse_bot_event(payload: dict[str, Any]) -> SlackQuestion | SlackReaction | None:
    """What an Events API payload asks of the bot, or ``None``: an ``app_mention``, a direct
    message from a person (no subtype, no ``bot_id``, ``channel_type`` ``im``), or a 👍/👎
    ``reaction_added`` on a message."""
    event_id = payload.get("event_id")
    event = payload.get("event")
    if not isinstance(event_id, str) or not event_id or not isinstance(event, dict):
        return None
    kind = event.get("type")
    user = event.get("user")
    if not isinstance(user, str) or not user:
        return None
    if kind == "reaction_added":
        raw_item = event.get("item")
        item: dict[str, Any] = raw_item if isinstance(raw_item, dict) else {}
        reaction = str(event.get("reaction") or "").split("::")[0]  # "+1::skin-tone-2"
        vote = 1 if reaction in UP_REACTIONS else -1 if reaction in DOWN_REACTIONS else 0
        if not vote or item.get("type") != "message" or not item.get("channel") or not item.get("ts"):
            return None
        return SlackReaction(event_id=event_id, channel=str(item["channel"]), user=user, ts=str(item["ts"]), vote=vote)
    direct = kind == "message" and event.get("channel_type") == "im"
    if kind != "app_mention" and not direct:
        return None
    if event.get("subtype") or event.get("bot_id"):
        return None  # an edit, a join, or a bot (this one included) talking
    ts, channel = event.get("ts"), event.get("channel")
    if not isinstance(ts, str) or not isinstance(channel, str):
        return None
    text = " ".join(slack_plain_text(_MENTION.sub(" ", str(event.get("text") or ""))).split())
    return SlackQuestion(
        event_id=event_id,
        channel=channel,
        user=user,
        text=text,
        ts=ts,
        thread_ts=str(event.get("thread_ts") or ts),
    )


def slack_plain_text(text: str) -> str:
    """A message's text as its reader sees it: ``<#C1|general>`` -> ``#general``,
    ``<https://x|label>`` -> ``label (https://x)``, ``<@U1>`` and ``<!channel>``-style
    mentions dropped, and ``&lt; &gt; &amp;`` (Slack's only escapes) undone."""

    def plain(match: re.Match[str]) -> str:
        target, _, label = match.group(1).partition("|")
        if target.startswith(("@", "!")):
            return " "
        if target.startswith("#"):
            return "#" + (label or target[1:])
        return f"{label} ({target})" if label and label != target else target

    text = _SLACK_MARKUP.sub(plain, text)
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def portal_user_for_slack_user(*, tenant_id: int, source_id: int, slack_user: str):
    """The portal user a Slack user is, or ``None``: the source's identity ``slack:<id>`` has an
    email, and exactly one member of the tenant has verified that address."""
    with tenant_context(tenant_id):
        identity = ExternalIdentity.objects.filter(source_id=source_id, principal=f"slack:{slack_user}").first()
    email = email_key(identity.email) if identity is not None and identity.email else ""
    if not email:
        return None
    candidates = {
        a.user
        for a in EmailAddress.objects.filter(email__iexact=email, verified=True).select_related("user")
        if email_key(a.email) == email and a.user.is_active
    }
    members = [u for u in candidates if any(m.tenant_id == tenant_id for m in membership_list_for_user(u))]
    return members[0] if len(members) == 1 else None


def slack_escape(text: str) -> str:
    """``&``, ``<`` and ``>`` as Slack's ``mrkdwn`` requires: the only characters it reads as markup
    openers (``<!channel>``, ``<@U1>``, ``<url|label>``)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_text(answer: str, sources: list[dict[str, Any]]) -> str:
    """An answer as Slack ``mrkdwn``: Markdown's backslash escapes dropped (Slack shows them),
    ``&``, ``<``, ``>`` escaped, ``**bold**`` as ``*bold*``, each ``[n]`` a link to its source
    when the source has an absolute http(s) link, then the sources, one per line."""
    links = {s["n"]: _absolute(str(s.get("link") or "")) for s in sources}
    text = slack_escape(answer_terminal_text(answer[:SLACK_TEXT_CHARS]))
    text = text.replace("**", "*")
    text = _CITATION.sub(
        lambda m: f"<{links[int(m.group(1))]}|[{m.group(1)}]>" if links.get(int(m.group(1))) else m.group(0), text
    )
    lines = [text]
    if sources:
        lines.append("")
        lines.append("*Sources*")
        for s in sources:
            title = slack_escape(str(s.get("title") or ""))
            title = title.replace("|", "¦")[:150]
            link = links.get(s["n"])
            lines.append(f"[{s['n']}] <{link}|{title}>" if link else f"[{s['n']}] {title}")
    return "\n".join(lines)


def _absolute(link: str) -> str:
    """An absolute http(s) link safe inside Slack's ``<link|label>``: spaces, ``<``, ``>``, ``|``
    and other characters a URL may not hold are percent-encoded (a document's URL must not close
    the link and write ``<!channel>`` or a label of its own); ``""`` for anything else."""
    public = (getattr(settings, "KB_PUBLIC_URL", "") or "").rstrip("/")
    if link.startswith("/") and not link.startswith("//") and public:
        link = public + link
    if not link.startswith(("http://", "https://")):
        return ""
    return quote(link, safe=_LINK_SAFE)


class SlackBot:
    """Answers the questions and records the votes of one Slack data source's workspace.

    ``web`` is a ``slack_sdk.WebClient`` authenticated with the source's bot token. ``handle``
    takes an Events API payload and returns what it did: ``"answered"``, ``"unlinked"`` (the
    how-to-link reply), ``"voted"``, ``"duplicate"`` or ``"ignored"``. Web API errors raise
    (``slack_sdk.errors.SlackApiError``); the listener logs and counts them.
    """

    def __init__(self, *, tenant_id: int, source_id: int, web) -> None:
        self.tenant_id = tenant_id
        self.source_id = source_id
        self.web = web

    def handle(self, payload: dict[str, Any]) -> str:
        event = parse_bot_event(payload)
        if event is None:
            return "ignored"
        if not slack_event_claim(tenant_id=self.tenant_id, source_id=self.source_id, event_id=event.event_id):
            return "duplicate"
        try:
            if isinstance(event, SlackReaction):
                return self._vote(event)
            return self._answer(event)
        except Exception:
            # Nothing was posted (or the vote not stored): let Slack's redelivery try again.
            slack_event_release(tenant_id=self.tenant_id, source_id=self.source_id, event_id=event.event_id)
            raise

    def _reply(self, question: SlackQuestion, text: str) -> dict[str, Any]:
        response = self.web.chat_postMessage(
            channel=question.channel, thread_ts=question.thread_ts, text=text, unfurl_links=False, unfurl_media=False
        )
        return response.data if hasattr(response, "data") else dict(response)

    @staticmethod
    def _rate_limited(user) -> int | None:
        """Count one question against the asker's ``KB_ASK_RATE`` (the web page's bucket); the
        seconds to wait when over it, else ``None``."""
        request = HttpRequest()
        request.user = user
        usage = get_usage(request, group="web-ask", key="user", rate=settings.KB_ASK_RATE, increment=True)
        if usage is not None and usage["should_limit"]:
            return max(1, int(usage["time_left"]))
        return None

    def _conversation_id(self, scope, question: SlackQuestion, user, text: str) -> str:
        key = f"{question.channel}:{question.thread_ts}"[: Conversation.SLACK_THREAD_CHARS]
        with tenant_context(self.tenant_id, user_id=user.pk):
            conversation = Conversation.objects.filter(user=user, slack_thread=key, project_id=scope.project_id).first()
            if conversation is None:
                conversation = Conversation.objects.create(
                    tenant_id=self.tenant_id,
                    user=user,
                    project_id=scope.project_id,
                    slack_thread=key,
                    title=text[: Conversation.TITLE_CHARS],
                )
        return str(conversation.public_id)

    def _answer(self, question: SlackQuestion) -> str:
        user = portal_user_for_slack_user(tenant_id=self.tenant_id, source_id=self.source_id, slack_user=question.user)
        if user is None:
            self._reply(question, LINK_HELP)
            return "unlinked"
        try:
            scope = scope_for_user(user, tenant_id=self.tenant_id)
        except ScopeNotFound:
            self._reply(question, NO_PROJECT)
            return "unlinked"
        if not question.text:
            self._reply(
                question, "Ask me a question after the mention, for example: where do I find the deploy runbook?"
            )
            return "ignored"
        try:
            text = clean_query(question.text)
        except InvalidQuery as exc:
            self._reply(question, f"I could not ask that: {exc}.")
            return "ignored"
        if not question.channel.startswith("D"):  # a channel or group: others read the reply
            with tenant_context(self.tenant_id):
                open_project = Project.objects.filter(
                    pk=scope.project_id, visibility=Project.Visibility.TENANT
                ).exists()
            if not open_project:
                self._reply(question, ASK_PRIVATELY)
                return "ignored"
            scope = dataclasses.replace(scope, principals=())  # rows restricted to anyone stay out
        retry_after = self._rate_limited(user)
        if retry_after is not None:
            self._reply(question, f"You have asked too many questions; try again in {retry_after} seconds.")
            return "ignored"
        result = ask(text, scope, conversation_id=self._conversation_id(scope, question, user, text))
        sources = [{"n": ev.n, "title": ev.title, "link": ev.link} for ev in result.sources]
        reply = slack_text(result.answer.text, sources)
        if result.verified is not None:  # checked by someone who knows: shown first, as on the web page
            verified = result.verified
            note = f"verified by {verified.verified_by} on {verified.verified_at:%Y-%m-%d}"
            if verified.stale:
                note += "; a source it cites has changed since"
            reply = (
                f"*Verified answer* ({slack_escape(note)})\n"
                f"{slack_text(verified.text, verified.sources)}\n\n*Fresh answer*\n{reply}"
            )
        posted = self._reply(question, reply)
        ts = posted.get("ts")
        if isinstance(ts, str) and ts:
            with tenant_context(self.tenant_id, user_id=user.pk):
                try:
                    SlackAnswer.objects.create(
                        tenant_id=self.tenant_id,
                        source_id=self.source_id,
                        channel=question.channel,
                        ts=ts,
                        answer_record=AnswerRecord.objects.get(public_id=result.answer_id),
                    )
                except IntegrityError:  # Slack reused a ts: keep the first answer's link
                    logger.warning("Slack answer %s:%s recorded already", question.channel, ts)
        return "answered"

    def _vote(self, reaction: SlackReaction) -> str:
        with tenant_context(self.tenant_id):
            posted = (
                SlackAnswer.objects.filter(source_id=self.source_id, channel=reaction.channel, ts=reaction.ts)
                .select_related("answer_record")
                .first()
            )
        if posted is None:
            return "ignored"
        user = portal_user_for_slack_user(tenant_id=self.tenant_id, source_id=self.source_id, slack_user=reaction.user)
        if user is None:
            return "ignored"
        try:
            answer_feedback_submit(actor=user, answer_id=posted.answer_record.public_id, vote=reaction.vote)
        except AnswerNotFound:
            return "ignored"  # only the asker votes on an answer
        return "voted"
