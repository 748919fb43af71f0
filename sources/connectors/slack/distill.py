"""Slack thread distillation and bursts: what gets embedded for a thread, and its finer rows.

**Distillation.** A thread's embedded text (``DocumentRow.text``; ``content`` stays the raw
transcript for display and full-text search) is its distillation, kept also as
``metadata["distilled"]``::

    {"question": str, "summary": str, "resolution": str, "resolution_by": str,
     "resolution_ts": str, "resolution_reason": str, "systems": [str], "code_refs": [str],
     "method": "rules" | "llm", "key": sha256 hex, "llm_error": str (only after a failed call)}

Without an LLM (:func:`distill_rules`, deterministic): the question is the root message
cleaned (leading mentions and greetings dropped, whitespace collapsed, at most 400 characters);
the resolution is, in this order, the last substantive reply carrying a check-mark reaction, else
the latest of "the asker says it is fixed" (that message, when it says how) and "the asker
acknowledges it worked" (the substantive reply by someone else it acknowledges), else the last
substantive reply by someone other than the asker (technical ones, with code, a link or an
identifier, first). Systems are named identifiers (URL hosts, CamelCase, snake_case, dotted
names, ALL-CAPS); code references are backticked spans, the first line of code blocks, file
paths and error strings. With an LLM configured (``OPENAI_BASE_URL``/``OPENAI_API_KEY`` and
``KB_LLM_MODEL``) one chat call per thread returns the same fields as strict JSON; any failure
(transport, HTTP error, not JSON, wrong shape) falls back to the rules and records
``llm_error``. A stored distillation whose ``key`` (sha256 of the thread's messages, reactions
and the distiller) still matches is reused, so an unchanged thread is never distilled again.

**Bursts.** Inside a thread or a conversation of at least ``BURST_MIN_PARENT_MESSAGES``
messages, consecutive messages by one author (each within ``RUN_GAP_SECONDS`` of the previous,
at most ``RUN_MAX_MESSAGES``) form a run; the run that opens a thread (the question) is left to
the distillation. A run becomes a ``burst`` row when it passes the design's weighted threshold:
it holds a token with IDF >= 4.0, or it is >= 200 characters long, or one of its messages has a
reaction. A run that is only acknowledgement ("thanks, sounds good!") never is. IDF is
ln(N / df) (Spärck Jones, 1972) over the source's term statistics (``TermStat``, N =
``DataSource.indexed_rows``, lexemes from PostgreSQL's ``english`` configuration, as the search
vector). A source with no statistics yet (its first run) uses a heuristic instead: a word of 4+
letters that is not among the 8,000 most frequent English words (``data/english_common.txt``,
from wordfreq) and appears in at most one other message of the thread. Which runs became bursts
is stored on the parent (``metadata["bursts"] = {"key", "starts"}``) and reused while the
parent's messages are unchanged, so a second run, with statistics now, writes the same rows.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kbportal.llm_client import llm_client, llm_model
from sources.term_statistics import SourceTermStatistics, TermStatistics, common_word

if TYPE_CHECKING:
    from sources.connectors.slack.messages import SlackMessage

logger = logging.getLogger(__name__)

DISTILL_VERSION = "1"
RARE_IDF = 4.0  # the design's rare-token threshold: ln(N / df) >= 4.0
BURST_MIN_CHARS = 200
BURST_MIN_PARENT_MESSAGES = 3
RUN_GAP_SECONDS = 10 * 60
RUN_MAX_MESSAGES = 5
RUN_MAX_CHARS = 1500
QUESTION_CHARS = 400
RESOLUTION_CHARS = 400
TOPIC_CHARS = 160
MAX_SYSTEMS = 20
MAX_CODE_REFS = 20
LLM_TRANSCRIPT_CHARS = 6000
EMBED_CHARS = 1500

# Reactions that mark the answer (Slack's names for ✅ ✔️ ☑️ and common custom ones).
RESOLUTION_REACTIONS = frozenset(
    {"white_check_mark", "heavy_check_mark", "ballot_box_with_check", "solved", "resolved", "check", "accepted"}
)
# Words that make up pure acknowledgement / small talk ("thanks, sounds good!").
ACK_WORDS = frozenset(
    """thanks thank thx ty tyvm you u ok okay k kk cool nice great good sounds sound awesome perfect
    sure yes yep yeah yup no nope np lol haha hah heh ha will do done got it that this works worked
    work makes sense agreed agree right true indeed exactly welcome much a lot so very really
    too me as well all the for and i i'll ill we we'll oh ah wow neat appreciated appreciate it's
    its is was lgtm +1 gotcha alright fine totally definitely absolutely cheers""".split()
)
_ACK_WORKED = re.compile(
    r"\b(that (?:worked|works|did it|fixed it|helped|was it)|works now|it works|worked for me|"
    r"did the trick|works like a charm|that's it|that is it|perfect|(?:thanks|thank you|thx|ty)\b)",
    re.IGNORECASE,
)
_SELF_FIX = re.compile(
    r"\b(fixed it|solved it|figured it out|got it working|found the (?:issue|problem|fix|solution|cause)|"
    r"the (?:fix|solution|problem|issue|cause) was|turn(?:s|ed) out|works now|resolved it)\b",
    re.IGNORECASE,
)
# The asker says how it was fixed: an answer however short ("fixed by pinning the image").
_SELF_FIX_HOW = re.compile(
    r"\b((?:fixed|solved|resolved) (?:it |this |that )?(?:by|with|via)|the (?:fix|solution|cause) (?:was|is)|"
    r"turn(?:s|ed) out)\b",
    re.IGNORECASE,
)
_NEGATION = re.compile(
    r"\b(didn'?t|doesn'?t|does not|did not|not|no luck|still (?:get|fail|broken|see)|isn'?t|won'?t|can'?t)\b",
    re.IGNORECASE,
)
_GREETING = re.compile(r"^(?:(?:hey|hi|hello|yo|morning|good morning|folks|all|everyone|guys|team)[\s,!.:-]*)+", re.I)
# A rendered mention: "@" and a display name of up to three words ("@Bo Penn 469", "@ana").
_MENTION_ANY = re.compile(r"@[\w.-]+(?:[ \t]+(?:[A-Z][\w'.-]*|\d+)\b){0,2}")
_MENTION = re.compile(r"^(?:@[\w.-]+(?:[ \t]+(?:[A-Z][\w'.-]*|\d+)\b){0,2}[\s,:]*)+")
_CODE_BLOCK = re.compile(r"```(.*?)```", re.DOTALL)
_INLINE_CODE = re.compile(r"`([^`\n]{1,200})`")
_URL = re.compile(r"https?://[^\s<>|)\]]+")
_URL_HOST = re.compile(r"https?://([A-Za-z0-9.-]+)")
_CAMEL = re.compile(r"\b[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+\b|\b[a-z]+(?:[A-Z][a-z0-9]+)+\b")
_SNAKE = re.compile(r"\b[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)+\b")
_DOTTED = re.compile(r"(?<![\w/.])[A-Za-z_][\w-]*(?:\.[A-Za-z_][\w-]*)+(?![\w(])")
_ALL_CAPS = re.compile(r"\b[A-Z][A-Z0-9]{1,}(?:[-_][A-Z0-9]+)*\b")
_FILE_PATH = re.compile(
    r"(?<![\w/.])(?:[\w.-]+/)*[\w-]+\.(?:py|clj|cljs|cljc|edn|js|jsx|ts|tsx|json|ya?ml|toml|md|java|go|rs|rb|sh|"
    r"xml|gradle|properties|sql|html|css|cfg|ini|conf|lock|txt|csv|el|kt|scala|c|h|cpp|hpp)\b"
)
_ERROR = re.compile(r"\b(?:[a-z][\w]*\.)*[A-Z]\w*(?:Error|Exception|Failure)\b(?::[^\n]{0,160})?")
_SLACK_ID = re.compile(r"\b[UWCGBS][A-Z0-9]{8,10}\b")
_WORD = re.compile(r"[A-Za-z][A-Za-z'-]*[A-Za-z]|[A-Za-z]")
_EMOJI = re.compile(r":[a-z0-9_+-]+:")
# ALL-CAPS words that are not names of anything.
_CAPS_STOP = frozenset(
    "OK LOL FYI IMO IMHO TIL BTW ASAP WTF OMG IIRC AFAIK TBH PS NB TL DR TLDR AM PM THE AND YES NO I A".split()
)
_DOTTED_STOP = frozenset({"e.g", "i.e", "etc", "a.k.a", "vs"})

DISTILL_SCHEMA = {
    "type": "object",
    "properties": {
        "question": {"type": "string"},
        "summary": {"type": "string"},
        "resolution": {"type": "string"},
        "systems": {"type": "array", "items": {"type": "string"}},
        "code_refs": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["question", "summary", "resolution", "systems", "code_refs"],
    "additionalProperties": False,
}
_LLM_SYSTEM = (
    "You distill a Slack thread for a company knowledge base. Reply with JSON only: "
    '{"question": one line an engineer would search for, naming the concrete problem, '
    '"summary": at most three sentences, "resolution": what solved or answered it ("" if nothing did), '
    '"systems": names of systems, services, hosts, libraries and identifiers mentioned, '
    '"code_refs": code snippets, commands, file paths and error strings quoted}. '
    "Use only what the thread says."
)


# -- text helpers ------------------------------------------------------------------------------


def _collapse(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def cut(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, at a word boundary when one is near, with "…"."""
    if len(text) <= limit:
        return text
    head = text[: limit - 1]
    space = head.rfind(" ")
    if space > limit * 0.8:
        head = head[:space]
    return head.rstrip() + "…"


def clean_question(text: str) -> str:
    """The root message as a question: leading mentions and greetings dropped, code blocks
    reduced to their content, whitespace collapsed, at most ``QUESTION_CHARS`` characters."""
    text = _CODE_BLOCK.sub(lambda m: " " + m.group(1).strip() + " ", text)
    text = _collapse(text)
    for _ in range(3):
        text = _MENTION.sub("", _GREETING.sub("", text)).lstrip(" ,:-")
    return cut(text, QUESTION_CHARS)


def words(text: str, *, names: frozenset[str] = frozenset()) -> list[str]:
    """Lowercase words of ``text`` with emoji codes, mentions, URLs and the words of ``names``
    (lowercase words of people's names) removed."""
    text = _URL.sub(" ", _EMOJI.sub(" ", text))
    text = _MENTION_ANY.sub(" ", text)
    return [w for w in (w.lower() for w in _WORD.findall(text)) if w not in names]


def name_words(messages: list[SlackMessage]) -> frozenset[str]:
    """Lowercase words of the names of the messages' authors and reactors (not rare terms)."""
    names = {m.author for m in messages} | {n for m in messages for _, _, people in m.reactions for n in people}
    return frozenset(w.lower() for name in names for w in _WORD.findall(name))


def without_names(text: str, names: frozenset[str]) -> str:
    """``text`` with mentions and the words of ``names`` removed (what IDF is computed on)."""
    text = _MENTION_ANY.sub(" ", text)
    return re.sub(
        r"[A-Za-z][A-Za-z'-]*[A-Za-z]|[A-Za-z]", lambda m: " " if m.group(0).lower() in names else m.group(0), text
    )


def is_acknowledgement(text: str) -> bool:
    """True when ``text`` is only thanks/agreement/small talk ("thanks, sounds good!", ":+1:", "ok")."""
    if _CODE_BLOCK.search(text) or _INLINE_CODE.search(text) or _URL.search(text):
        return False
    return all(w in ACK_WORDS or len(w) <= 2 for w in words(text))


def is_technical(text: str) -> bool:
    """True when ``text`` carries code, a link, a file path, an error or a compound identifier."""
    return bool(
        _CODE_BLOCK.search(text)
        or _INLINE_CODE.search(text)
        or _URL.search(text)
        or _FILE_PATH.search(text)
        or _ERROR.search(text)
        or _SNAKE.search(text)
        or _CAMEL.search(text)
    )


def is_substantive(text: str) -> bool:
    """A reply that can answer something: not acknowledgement, and technical or >= 40 characters."""
    if is_acknowledgement(text):
        return False
    return is_technical(text) or len(_collapse(text)) >= 40


def _unique(items: list[str], limit: int) -> list[str]:
    seen: set[str] = set()
    out: list[str] = []
    for item in items:
        item = item.strip().strip(".,;:")
        if len(item) < 2 or item.casefold() in seen:
            continue
        seen.add(item.casefold())
        out.append(item)
        if len(out) >= limit:
            break
    return out


def extract_systems(text: str) -> list[str]:
    """Named systems in ``text``, in order of first appearance (at most ``MAX_SYSTEMS``): URL
    hosts, CamelCase, snake_case, dotted names (``com.fasterxml.jackson``), ALL-CAPS (``AWS``)."""
    found: list[tuple[int, str]] = [(m.start(), m.group(1)) for m in _URL_HOST.finditer(text)]
    without_urls = _URL.sub(lambda m: " " * len(m.group(0)), text)
    # Emoji codes (:the_horns:) and unresolved Slack ids (U0E0VSHNJ) name no system.
    without_urls = _EMOJI.sub(lambda m: " " * len(m.group(0)), without_urls)
    without_urls = _SLACK_ID.sub(lambda m: " " * len(m.group(0)), without_urls)
    for pattern in (_CAMEL, _SNAKE, _DOTTED):
        found += [(m.start(), m.group(0)) for m in pattern.finditer(without_urls)]
    for m in _ALL_CAPS.finditer(without_urls):
        token = m.group(0)
        if token not in _CAPS_STOP and (len(token) >= 3 or any(c.isdigit() for c in token)):
            found.append((m.start(), token))
    found = [(pos, name) for pos, name in found if name.lower() not in _DOTTED_STOP]
    found.sort(key=lambda item: item[0])
    return _unique([name for _, name in found], MAX_SYSTEMS)


def extract_code_refs(text: str) -> list[str]:
    """Code references in ``text``, in order (at most ``MAX_CODE_REFS``): the first line of each
    code block, backticked spans, file paths and error strings (``NoSuchMethodError: ...``)."""
    found: list[tuple[int, str]] = []
    for m in _CODE_BLOCK.finditer(text):
        first = next((line.strip() for line in m.group(1).splitlines() if line.strip()), "")
        if first:
            found.append((m.start(), cut(first, 160)))
    rest = _CODE_BLOCK.sub(lambda m: " " * len(m.group(0)), text)
    found += [(m.start(), m.group(1)) for m in _INLINE_CODE.finditer(rest)]
    plain = _INLINE_CODE.sub(lambda m: " " * len(m.group(0)), _URL.sub(lambda m: " " * len(m.group(0)), rest))
    found += [(m.start(), m.group(0)) for m in _FILE_PATH.finditer(plain)]
    found += [(m.start(), cut(m.group(0).strip(), 200)) for m in _ERROR.finditer(plain)]
    found.sort(key=lambda item: item[0])
    return _unique([ref for _, ref in found], MAX_CODE_REFS)


# -- distillation ------------------------------------------------------------------------------


def messages_key(messages: list[SlackMessage], *, salt: str) -> str:
    """sha256 hex over the messages (ts, author, text, reactions) and ``salt`` (the distiller)."""
    h = hashlib.sha256(f"{DISTILL_VERSION}\x00{salt}\x00".encode())
    for m in messages:
        reactions = sorted((name, count) for name, count, _ in m.reactions)
        h.update(json.dumps([m.ts, m.author, m.text, reactions, m.bot], ensure_ascii=False).encode())
        h.update(b"\x00")
    return h.hexdigest()


def _resolution(messages: list[SlackMessage], asker: str, root: SlackMessage | None) -> tuple[SlackMessage | None, str]:
    """(the message that resolves the thread, why), or ``(None, "")``; see the module docstring."""
    replies = [m for m in messages if m is not root]
    for m in reversed(replies):
        if any(name in RESOLUTION_REACTIONS for name, _, _ in m.reactions) and is_substantive(m.text):
            return m, "marked with a check-mark reaction"
    signals: list[tuple[int, SlackMessage, str]] = []
    for i, m in enumerate(replies):
        if m.author != asker or _NEGATION.search(m.text):
            continue
        if _SELF_FIX_HOW.search(m.text) or (
            _SELF_FIX.search(m.text) and is_substantive(m.text) and len(_collapse(m.text)) >= 60
        ):
            signals.append((i, m, "the asker's own fix"))
        elif _ACK_WORKED.search(m.text) or _SELF_FIX.search(m.text):
            answer = next(
                (r for r in reversed(replies[:i]) if r.author != asker and is_substantive(r.text)),
                None,
            )
            if answer is not None:
                signals.append((i, answer, f"acknowledged by {asker}"))
    if signals:
        _, message, why = max(signals, key=lambda s: s[0])
        return message, why
    others = [m for m in replies if m.author != asker and not m.bot and is_substantive(m.text)]
    technical = [m for m in others if is_technical(m.text)]
    if technical:
        return technical[-1], "last technical reply"
    if others:
        return others[-1], "last substantive reply"
    return None, ""


def distill_rules(messages: list[SlackMessage], *, channel: str, root: SlackMessage | None) -> dict[str, Any]:
    """The deterministic distillation of a thread (``messages`` in time order, ``root`` the
    parent message or ``None`` when it is missing). Returns the fields of the module docstring
    without ``method``/``key``."""
    first = root or messages[0]
    asker = first.author
    resolution, why = _resolution(messages, asker, root)
    everything = "\n".join(m.text for m in messages)
    repliers = []
    for m in messages:
        if m is not first and m.author != asker and m.author not in repliers:
            repliers.append(m.author)
    replies = len(messages) - 1
    people = ", ".join(repliers[:3]) + (f" and {len(repliers) - 3} more" if len(repliers) > 3 else "")
    summary = f"{asker} asked in #{channel}; {replies} repl{'y' if replies == 1 else 'ies'}"
    summary += f" from {people}." if people else "."
    if resolution is not None:
        summary += f" Resolved by {resolution.author} ({why})."
    else:
        summary += " No answer yet."
    question = clean_question(first.text)
    if root is None:
        question = f"{question} (the thread's first message is not available)"
    return {
        "question": question,
        "summary": summary,
        "resolution": cut(_collapse(resolution.text), RESOLUTION_CHARS) if resolution else "",
        "resolution_by": resolution.author if resolution else "",
        "resolution_ts": resolution.ts if resolution else "",
        "resolution_reason": why,
        "systems": extract_systems(everything),
        "code_refs": extract_code_refs(everything),
    }


def _checked(data: Any) -> dict[str, Any]:
    """The LLM's answer as the distillation fields; raises ``ValueError`` naming what is wrong."""
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    out: dict[str, Any] = {}
    for key in ("question", "summary", "resolution"):
        value = data.get(key)
        if not isinstance(value, str):
            raise ValueError(f"field {key!r} is not a string")
        out[key] = cut(_collapse(value), QUESTION_CHARS if key == "question" else RESOLUTION_CHARS * 2)
    if not out["question"]:
        raise ValueError("field 'question' is empty")
    for key, limit in (("systems", MAX_SYSTEMS), ("code_refs", MAX_CODE_REFS)):
        value = data.get(key)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"field {key!r} is not a list of strings")
        out[key] = _unique([cut(v, 200) for v in value], limit)
    return out


def distill_llm(messages: list[SlackMessage], *, channel: str, transcript: str) -> dict[str, Any]:
    """One chat call distilling the thread (strict JSON schema). Returns the checked fields.

    Raises ``ValueError`` (not JSON, wrong shape), ``RuntimeError`` (no LLM configured) or the
    ``openai`` client's errors (transport, HTTP status); callers fall back to the rules.
    """
    model = llm_model()
    if not model:
        raise RuntimeError("no LLM configured")
    response = llm_client().chat.completions.create(
        model=model,
        temperature=0,
        messages=[
            {"role": "system", "content": _LLM_SYSTEM},
            {"role": "user", "content": f"Channel #{channel}\n\n{cut(transcript, LLM_TRANSCRIPT_CHARS)}"},
        ],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "thread_distillation", "strict": True, "schema": DISTILL_SCHEMA},
        },
    )
    text = (response.choices[0].message.content or "").strip() if response.choices else ""
    text = re.sub(r"^```(?:json)?\s*|\s*```$", "", text)
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"not JSON: {exc}") from exc
    return _checked(data)


def distilled_text(channel: str, distilled: dict[str, Any]) -> str:
    """What is embedded for a thread: channel, question, summary, resolution, systems, code."""
    lines = [f"#{channel}", f"Question: {distilled['question']}", f"Summary: {distilled['summary']}"]
    if distilled.get("resolution"):
        lines.append(f"Resolution: {distilled['resolution']}")
    if distilled.get("systems"):
        lines.append("Systems: " + ", ".join(distilled["systems"]))
    if distilled.get("code_refs"):
        lines.append("Code: " + "; ".join(distilled["code_refs"]))
    return cut("\n".join(lines), EMBED_CHARS)


# -- bursts ------------------------------------------------------------------------------------


@dataclass
class Run:
    """Consecutive messages by one author inside a thread or conversation."""

    messages: list[SlackMessage]

    @property
    def first_ts(self) -> str:
        return self.messages[0].ts

    @property
    def text(self) -> str:
        return "\n".join(m.text for m in self.messages)

    @property
    def has_reaction(self) -> bool:
        return any(count > 0 for m in self.messages for _, count, _ in m.reactions)


def message_runs(messages: list[SlackMessage]) -> list[Run]:
    """``messages`` (time order) cut into runs: same author, each within ``RUN_GAP_SECONDS`` of
    the previous, at most ``RUN_MAX_MESSAGES`` messages and about ``RUN_MAX_CHARS`` characters."""
    runs: list[Run] = []
    for m in messages:
        if runs:
            run = runs[-1]
            last = run.messages[-1]
            if (
                m.author == last.author
                and m.seconds - last.seconds <= RUN_GAP_SECONDS
                and len(run.messages) < RUN_MAX_MESSAGES
                and len(run.text) + len(m.text) <= RUN_MAX_CHARS
            ):
                run.messages.append(m)
                continue
        runs.append(Run([m]))
    return runs


def _heuristic_rare(run: Run, all_messages: list[SlackMessage], names: frozenset[str]) -> bool:
    """The no-statistics stand-in for "a token with IDF >= 4.0" (see the module docstring)."""
    inside = {id(m) for m in run.messages}
    other_words = [set(words(m.text, names=names)) for m in all_messages if id(m) not in inside]
    for word in set(words(run.text, names=names)):
        if len(word) < 4 or "'" in word or common_word(word.strip("-")):
            continue
        if sum(1 for ws in other_words if word in ws) <= 1:
            return True
    return False


@dataclass
class Distiller:
    """Distils threads and picks bursts for one data source.

    ``stats``: the source's term statistics (``TermStatistics()``: none, use the heuristic);
    ``stored``: ``external_id -> metadata`` of the source's stored thread and conversation rows,
    or a callable ``(channel_id) -> that mapping`` (loaded once per channel), for reuse by key;
    ``use_llm``: ``None`` follows the settings. ``llm_calls`` counts chat calls made.
    """

    stats: TermStatistics = field(default_factory=TermStatistics)
    stored_loader: Any = None
    use_llm: bool | None = None
    llm_calls: int = 0
    _stored: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)

    def stored(self, channel_id: str, external_id: str) -> dict[str, Any]:
        if self.stored_loader is None:
            return {}
        if channel_id not in self._stored:
            self._stored[channel_id] = self.stored_loader(channel_id)
        return self._stored[channel_id].get(external_id) or {}

    def _llm_salt(self) -> str | None:
        if self.use_llm is False:
            return None
        model = llm_model()
        return f"llm:{model}" if model else None

    def thread(
        self,
        *,
        channel_id: str,
        channel: str,
        external_id: str,
        messages: list[SlackMessage],
        root: SlackMessage | None,
        transcript: str,
    ) -> dict[str, Any]:
        """The thread's distillation (fields of the module docstring), reused when its key matches."""
        salt = self._llm_salt() or "rules"
        key = messages_key(messages, salt=salt)
        previous = self.stored(channel_id, external_id).get("distilled")
        if isinstance(previous, dict) and previous.get("key") == key:
            return _canonical(previous)
        distilled = distill_rules(messages, channel=channel, root=root)
        method = "rules"
        error = ""
        if salt != "rules":
            self.llm_calls += 1
            try:
                answer = distill_llm(messages, channel=channel, transcript=transcript)
            except Exception as exc:  # any failure: the rules' distillation stands
                error = f"{type(exc).__name__}: {str(exc)[:300]}"
                logger.warning("distilling %s with the LLM failed, rules used: %s", external_id, error)
            else:
                # The resolution's author and time stay the rules' (the LLM gives prose only).
                keep = {k: distilled[k] for k in ("resolution_by", "resolution_ts", "resolution_reason")}
                if not answer["resolution"]:
                    keep = {"resolution_by": "", "resolution_ts": "", "resolution_reason": ""}
                distilled = {**answer, **keep}
                method = "llm"
        distilled = {**distilled, "method": method, "key": key}
        if error:
            distilled["llm_error"] = error
        return _canonical(distilled)

    def bursts(
        self,
        *,
        channel_id: str,
        parent_external_id: str,
        messages: list[SlackMessage],
        skip_first_run: bool,
    ) -> tuple[list[Run], dict[str, Any]]:
        """``(runs that become bursts, the parent's "bursts" metadata)`` for a parent's messages.

        No bursts for a parent of fewer than ``BURST_MIN_PARENT_MESSAGES`` messages or a single
        run. ``skip_first_run``: a thread's opening run is its question (already distilled).
        """
        key = messages_key(messages, salt="bursts")
        runs = message_runs(messages)
        candidates = runs[1:] if skip_first_run else runs
        if len(messages) < BURST_MIN_PARENT_MESSAGES or len(runs) < 2:
            candidates = []
        previous = self.stored(channel_id, parent_external_id).get("bursts")
        if isinstance(previous, dict) and previous.get("key") == key and isinstance(previous.get("starts"), list):
            starts = set(previous["starts"])
            chosen = [run for run in candidates if run.first_ts in starts]
            return chosen, _canonical(previous)
        chosen = self.select(candidates, messages)
        return chosen, _canonical({"key": key, "starts": [run.first_ts for run in chosen]})

    def select(self, runs: list[Run], messages: list[SlackMessage]) -> list[Run]:
        """The runs that pass the weighted threshold (module docstring), in order."""
        open_runs: list[Run] = []
        chosen: set[int] = set()
        for index, run in enumerate(runs):
            if is_acknowledgement(run.text):
                continue
            if run.has_reaction or len(run.text) >= BURST_MIN_CHARS:
                chosen.add(index)
            else:
                open_runs.append(run)
        if open_runs:
            # People's names are not rare terms: a mention of a quiet member is no content.
            names = name_words(messages)
            if self.stats.has_stats():
                idfs = self.stats.max_idf([without_names(run.text, names) for run in open_runs])
                rare = {id(run) for run, idf in zip(open_runs, idfs, strict=True) if idf >= RARE_IDF}
            else:
                rare = {id(run) for run in open_runs if _heuristic_rare(run, messages, names)}
            chosen.update(i for i, run in enumerate(runs) if id(run) in rare)
        return [run for i, run in enumerate(runs) if i in chosen]


def _canonical(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with its keys sorted: a fresh dict and one read back from JSONB (which reorders
    keys) then give the same ``repr``, so the row's content hash does not change."""
    return dict(sorted(data.items()))


def source_distiller(*, tenant_id: int, source_id: int) -> Distiller:
    """A :class:`Distiller` reading the source's term statistics and stored distillations.

    Reads inside the tenant's context (row-level security applies). Raises
    ``DataSource.DoesNotExist`` when the source is gone.
    """
    from kbportal.tenancy import tenant_context
    from sources.models import DataSource, Document

    with tenant_context(tenant_id):
        n_rows = DataSource.objects.filter(pk=source_id).values_list("indexed_rows", flat=True).get()

    def load(channel_id: str) -> dict[str, dict[str, Any]]:
        with tenant_context(tenant_id):
            rows = Document.objects.filter(
                source_id=source_id, kind__in=("thread", "conversation"), metadata__channel_id=channel_id
            ).values_list("external_id", "metadata__distilled", "metadata__bursts")
            return {eid: {"distilled": distilled, "bursts": bursts} for eid, distilled, bursts in rows}

    return Distiller(
        stats=SourceTermStatistics(tenant_id=tenant_id, source_id=source_id, n_rows=int(n_rows or 0)),
        stored_loader=load,
    )
