"""``who_knows``: the people behind the best evidence for a question, ranked.

How a score is made (all within what the asker may read):

1. Run the hybrid search (``search.retrieval.hybrid_search``) over the scope and take the top
   ``HITS_CONSIDERED`` hits. The hit at 1-based rank ``r`` is worth ``w(r) = 1 / r``
   (reciprocal rank: the first hit counts as much as the next two together, so people behind
   the best evidence lead; RRF's ``1 / (60 + r)`` would make rank 1 and rank 10 nearly equal).
2. Each hit credits the people its metadata names, ``w(r) * role weight``, once per person per
   hit (the highest of their roles in it):

   - full weight (1.0): who wrote it: a commit's author (``author_name``/``author_email`` from
     the git connector, ``author`` from a JSONL commit log), the first author of a Slack thread
     or conversation (``authors[0]``), a record's ``author``, ``reporter``, ``assignee``,
     ``creator``, ``owner``, ``owners`` (a source's own person fields, e.g. the JSONL connector's
     ``person_fields``);
   - half weight (0.5): who took part: a thread's other ``authors`` and ``participants``
     (repliers and reactors), ``reviewers``, ``collaborators``, ``commenters``, and commenters
     named in a ticket's content by
     ticket-export comment lines (``Name (2025-02-10): text``).
3. A code or docs hit (``code_chunk``, ``code_file``, ``doc_section``, ``doc_page``) also credits
   the authors of the commit rows in scope whose ``files`` list its path, at full weight,
   shared by files touched: commit ``c`` weighs ``1 / (number of files c changed)``, and author
   ``a`` gets ``w(r) * sum(weights of a's commits) / sum(weights of all commits touching the
   path)``. A one-file fix says more about a file than a 300-file reformat. Each path is
   credited once, at its best rank.

``score(person) = sum over hits of those credits``. People are merged by normalised identity
(see :func:`person_key`): case, accents and separators are ignored (``Alex Martinez``,
``alex.martinez@corp.example`` and ``alex_martinez`` are one person), and a name and an email
seen together on one commit are one person. Bots (``dependabot[bot]``, ``marketplace-bot``) are
left out.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from search.pipeline.evidence import SNIPPET_CHARS, Evidence, evidence_from_hit
from search.retrieval import Hit, hybrid_search
from search.tools.base import register, scoped_hits
from sources.selectors import QueryScope

HITS_CONSIDERED = 20
AUTHOR_WEIGHT = 1.0
PARTICIPANT_WEIGHT = 0.5
PATH_KINDS = ("code_chunk", "code_file", "doc_section", "doc_page")
COMMIT_KINDS = ("commit", "pr")
MAX_COMMITS_PER_PATH = 500
PERSON_ROWS = 3  # person rows the pipeline tool puts before the documents
MAX_DOCUMENTS_PER_EXPERT = 10

# metadata field -> (role, weight). Fields holding one name or a list of names.
_PRIMARY_FIELDS = {
    "author": "author",
    "reporter": "reporter",
    "assignee": "assignee",
    "creator": "creator",
    "owner": "owner",
    "owners": "owner",
}
_SECONDARY_FIELDS = {
    "participants": "participant",
    "reviewers": "reviewer",
    "collaborators": "collaborator",
    "commenters": "commenter",
}
# A comment line of a ticket export: "Priya Natarajan (2025-02-11): Approved."
_COMMENT_LINE = re.compile(
    r"^['\"]?([A-Z][\w'.-]*(?: [A-Z][\w'.-]*){0,3}) \(\d{4}-\d{2}-\d{2}[^)]{0,20}\):\s", re.MULTILINE
)
_BOT = re.compile(r"(\[bot\]|(^|[\s._-])bot)$", re.IGNORECASE)
_EMAIL = re.compile(r"<?([^\s<>@]+@[^\s<>@]+\.[^\s<>@]+)>?")
_SEPARATORS = re.compile(r"[\s._-]+")
_PARENTHETICAL = re.compile(r"\s*\([^)]*\)\s*$")


@dataclass
class Mention:
    """A person as a row names them: a display name and/or an email address."""

    name: str
    email: str = ""


def _strip_accents(text: str) -> str:
    return "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))


def person_key(text: str) -> str:
    """The identity key of a name or an email's local part: accents dropped, case folded,
    ``.``/``_``/``-``/spaces as one space, a trailing ``(Candidate)`` dropped.

    ``"Alex  Martinez"``, ``"alex.martinez"`` and ``"ALEX_MARTINEZ"`` -> ``"alex martinez"``.
    """
    text = _PARENTHETICAL.sub("", text)
    return _SEPARATORS.sub(" ", _strip_accents(text).casefold()).strip()


def email_key(email: str) -> str:
    """The identity key of an email: its local part (after ``+`` for GitHub's
    ``123+name@users.noreply.github.com``) as :func:`person_key`."""
    local = email.split("@", 1)[0]
    if email.lower().endswith("users.noreply.github.com") and "+" in local:
        local = local.split("+", 1)[1]
    return person_key(local)


def parse_mention(raw: Any) -> Mention | None:
    """A :class:`Mention` from ``"Name"``, ``"Name <a@b.c>"`` or ``"a@b.c"``; ``None`` for
    empty values, non-strings and bots."""
    if not isinstance(raw, str):
        return None
    text = " ".join(raw.split())
    email = ""
    found = _EMAIL.search(text)
    if found:
        email = found.group(1).lower()
        text = (text[: found.start()] + text[found.end() :]).strip()
    name = _PARENTHETICAL.sub("", text).strip().strip("\"'")
    if not name and not email:
        return None
    if _BOT.search(name or email.split("@")[0]) or name.casefold() in {"unknown", "none", "n/a"}:
        return None
    return Mention(name=name, email=email)


def _names(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def row_people(hit: Hit) -> list[tuple[Mention, str, float]]:
    """``(mention, role, weight)`` for each person a row names (see the module docstring)."""
    meta = hit.metadata or {}
    found: list[tuple[Mention, str, float]] = []

    def add(raw: Any, role: str, weight: float) -> None:
        mention = parse_mention(raw)
        if mention is not None:
            found.append((mention, role, weight))

    if hit.kind in COMMIT_KINDS and (meta.get("author_name") or meta.get("author_email")):
        name, email = str(meta.get("author_name") or "").strip(), str(meta.get("author_email") or "").strip().lower()
        if not _BOT.search(name or email.split("@")[0]):
            found.append((Mention(name=name, email=email), "author", AUTHOR_WEIGHT))
    authors = meta.get("authors")
    if isinstance(authors, list) and authors:
        add(authors[0], "author", AUTHOR_WEIGHT)
        for other in authors[1:]:
            add(other, "commenter", PARTICIPANT_WEIGHT)
    for key, role in _PRIMARY_FIELDS.items():
        for raw in _names(meta.get(key)):
            add(raw, role, AUTHOR_WEIGHT)
    for key, role in _SECONDARY_FIELDS.items():
        for raw in _names(meta.get(key)):
            add(raw, role, PARTICIPANT_WEIGHT)
    if hit.kind not in PATH_KINDS:
        for name in _COMMENT_LINE.findall(hit.content or ""):
            add(name, "commenter", PARTICIPANT_WEIGHT)
    return found


class _Identities:
    """Union-find over identity keys: a name key and an email key seen in one mention join."""

    def __init__(self) -> None:
        self.parent: dict[str, str] = {}
        self.names: dict[str, Counter[str]] = defaultdict(Counter)
        self.emails: dict[str, set[str]] = defaultdict(set)

    def _find(self, key: str) -> str:
        self.parent.setdefault(key, key)
        while self.parent[key] != key:
            self.parent[key] = self.parent[self.parent[key]]
            key = self.parent[key]
        return key

    def add(self, mention: Mention) -> str | None:
        """Record a mention; returns its identity key, ``None`` when it has no usable name or email."""
        keys = [k for k in (person_key(mention.name) if mention.name else "", mention.email) if k]
        if mention.email and email_key(mention.email):
            keys.append(email_key(mention.email))
        if not keys:
            return None
        root = self._find(keys[0])
        for key in keys[1:]:
            other = self._find(key)
            if other != root:
                self.parent[other] = root
        if mention.name:
            self.names[keys[0]][mention.name] += 1
        if mention.email:
            self.emails[keys[0]].add(mention.email)
        return keys[0]

    def root(self, key: str) -> str:
        return self._find(key)

    def display(self, root: str) -> tuple[str, list[str]]:
        """The group's display name (a human-looking name, most often seen) and its aliases."""
        names: Counter[str] = Counter()
        emails: set[str] = set()
        for key in list(self.parent):
            if self._find(key) == root:
                names.update(self.names.get(key, {}))
                emails |= self.emails.get(key, set())
        ranked = sorted(names.items(), key=lambda kv: (" " not in kv[0], kv[0].islower(), -kv[1], -len(kv[0]), kv[0]))
        name = ranked[0][0] if ranked else sorted(emails)[0]
        aliases = sorted({n for n, _ in ranked[1:]} | emails, key=str.casefold)
        return name, aliases


@dataclass
class Expert:
    """A person and the evidence behind their score.

    ``score`` is the sum of their credits (module docstring; unitless, higher is more) and
    equals the sum of ``documents``' ``metadata["credit"]``. ``documents`` are the rows that
    earned it, most credit first, each an :class:`Evidence` whose ``metadata`` carries ``role``
    (author, reporter, assignee, commenter, participant, reviewer, file author, ...) and
    ``credit`` (the points it gave); after them, the commits that made the person a file's
    author (role ``committed to <path>``, credit 0, ``share`` = their part of the file credit).
    ``aliases``: other names and emails merged into this one.
    """

    name: str
    score: float
    documents: list[Evidence]
    aliases: list[str] = field(default_factory=list)
    # Every row that named this person (scored or supporting, listed or cut): what their name and
    # aliases were read from, so a stored answer is shown only to who may read all of them.
    named_in: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """JSON-safe: ``{"name", "score", "aliases", "documents": [Evidence.as_dict() ...]}``."""
        return {
            "name": self.name,
            "score": round(self.score, 4),
            "aliases": list(self.aliases),
            "documents": [ev.as_dict() for ev in self.documents],
        }


@dataclass
class _Credit:
    """What one row gave one person: ``points`` (in the score when ``counts``; a supporting
    commit's points are its share of a file credit, already counted there) at hit ``rank``."""

    hit: Hit
    role: str
    points: float
    rank: int
    counts: bool = True


def _commits_touching(paths: list[str], scope: QueryScope) -> dict[str, list[Hit]]:
    """Commit rows in scope whose ``files`` list each path (newest first, at most
    ``MAX_COMMITS_PER_PATH`` per path), through the scoped loader."""
    out: dict[str, list[Hit]] = {}
    for path in paths:
        out[path] = scoped_hits(
            scope,
            kinds=COMMIT_KINDS,
            where="d.metadata @> %(files)s::jsonb",
            params={"files": json.dumps({"files": [path]})},
            order_by="d.updated_at DESC NULLS LAST, d.id",
            limit=MAX_COMMITS_PER_PATH,
            content_chars=SNIPPET_CHARS,
        )
    return out


def _files_touched(commit: Hit) -> int:
    meta = commit.metadata
    count = meta.get("files_count") or meta.get("files_total")
    if isinstance(count, int) and count > 0:
        return count
    return max(1, len(meta.get("files") or []))


def who_knows(*, query: str, scope: QueryScope, limit: int = 10) -> list[Expert]:
    """People ranked by their part in the top evidence for ``query`` (module docstring).

    Returns at most ``limit`` experts, best first (ties by name). Each expert's ``documents``
    are the readable rows that earned the score, most credit first, then the commits that
    made them a file's author (these add no score of their own), at most
    ``MAX_DOCUMENTS_PER_EXPERT``. Only rows ``scope`` may read are ever looked at: the hybrid
    search and the commit lookup both apply the tenant, the allowed sources and the rows'
    principals. Raises ``search.retrieval.InvalidQuery`` for a blank or too long question.
    """
    hits = hybrid_search(query, scope, limit=HITS_CONSIDERED).hits
    identities = _Identities()
    scoring: dict[str, dict[int, _Credit]] = defaultdict(dict)  # identity key -> document id -> credit
    supporting: dict[str, dict[int, _Credit]] = defaultdict(dict)  # commits behind a file credit

    def keep(table: dict[str, dict[int, _Credit]], key: str, item: _Credit) -> None:
        best = table[key].get(item.hit.document_id)
        if best is None or item.points > best.points:
            table[key][item.hit.document_id] = item

    file_hits: dict[str, tuple[int, Hit]] = {}  # path -> (best rank, its hit)
    for rank, hit in enumerate(hits, start=1):
        for mention, role, role_weight in row_people(hit):
            key = identities.add(mention)
            if key is not None:
                keep(scoring, key, _Credit(hit, role, role_weight / rank, rank))
        if hit.kind in PATH_KINDS and hit.path and hit.path not in file_hits:
            file_hits[hit.path] = (rank, hit)
    file_shares: list[tuple[str, str, float]] = []  # (identity key, path, share)
    for path, commits in _commits_touching(list(file_hits), scope).items():
        rank = file_hits[path][0]
        weights = [1.0 / _files_touched(c) for c in commits]
        total = sum(weights)
        for commit, weight in zip(commits, weights, strict=True):
            author = next((m for m, role, _ in row_people(commit) if role == "author"), None)
            if author is None:
                continue
            key = identities.add(author)
            if key is None:
                continue
            share = AUTHOR_WEIGHT * weight / total / rank
            file_shares.append((key, path, share))
            keep(supporting, key, _Credit(commit, f"committed to {path}", share, rank, counts=False))
    # Summed per person once every name and email is known (one person's commits may use both).
    shares: dict[tuple[str, str], float] = defaultdict(float)
    for key, path, share in file_shares:
        shares[(identities.root(key), path)] += share
    for (root, path), points in shares.items():
        rank, file_hit = file_hits[path]
        keep(scoring, root, _Credit(file_hit, "file author", points, rank))
    by_person: dict[str, tuple[dict[int, _Credit], dict[int, _Credit]]] = defaultdict(lambda: ({}, {}))
    for table, slot in ((scoring, 0), (supporting, 1)):
        for key, by_doc in table.items():
            merged = by_person[identities.root(key)][slot]
            for doc_id, item in by_doc.items():
                if doc_id not in merged or item.points > merged[doc_id].points:
                    merged[doc_id] = item
    experts = []
    for root, (scored, support) in by_person.items():
        if not scored:
            continue
        order = lambda c: (-c.points, c.rank, c.hit.document_id)  # noqa: E731
        items = sorted(scored.values(), key=order)
        items += sorted((c for d, c in support.items() if d not in scored), key=order)
        documents = []
        for item in items[:MAX_DOCUMENTS_PER_EXPERT]:
            ev = evidence_from_hit(item.hit, tool="who_knows")
            credit = round(item.points, 4) if item.counts else 0.0
            ev.metadata = {**ev.metadata, "role": item.role, "credit": credit}
            if not item.counts:
                ev.metadata["share"] = round(item.points, 4)
            documents.append(ev)
        name, aliases = identities.display(root)
        score = sum(c.points for c in scored.values())
        named_in = sorted(set(scored) | set(support))
        experts.append(Expert(name=name, score=score, documents=documents, aliases=aliases, named_in=named_in))
    experts.sort(key=lambda e: (-e.score, e.name.casefold()))
    return experts[: max(limit, 0)]


def person_id(name: str) -> int:
    """The negative stand-in ``document_id`` of a person row: stable per normalised name, never
    equal to a real document's (positive) id, so evidence dedupes a person once."""
    digest = hashlib.sha256(person_key(name).encode("utf-8")).digest()
    return -(int.from_bytes(digest[:6], "big") + 1)


def person_evidence(expert: Expert) -> Evidence:
    """One evidence row of kind ``person`` for an expert (what the synthesizer can cite).

    ``title`` is the name; ``text`` says in how many of the documents found the person is
    credited, the score, and, per earning document, the role and the
    document's title and location, one sentence each; ``metadata`` holds ``person``, ``aliases``,
    ``score`` and ``documents`` (``[{document_id, external_id, source_public_id, title, kind,
    location, path, link, role, credit}]``, ``credit`` 0 for a commit that only supports a file credit). It
    has no url: the documents carry the links. ``lexical_rank``/``similarity`` are the best of
    its documents', so the answerability gate treats it as relevant exactly when its documents
    are.
    """
    counted = sum(1 for ev in expert.documents if ev.metadata.get("credit"))
    sentences = [
        f"{expert.name} wrote or took part in {counted} of the documents found for this question "
        f"(credit score {expert.score:.2f})."
    ]
    if expert.aliases:
        sentences.append(f"Also known as {', '.join(expert.aliases[:5])}.")
    for ev in expert.documents:
        where = f" ({ev.location})" if ev.location and ev.location != ev.title else ""
        sentences.append(f"{ev.metadata.get('role', 'named').capitalize()}: {ev.kind} \u201c{ev.title}\u201d{where}.")
    ranks = [ev.lexical_rank for ev in expert.documents if ev.lexical_rank is not None]
    similarities = [ev.similarity for ev in expert.documents if ev.similarity is not None]
    return Evidence(
        n=0,
        document_id=person_id(expert.name),
        kind="person",
        title=expert.name,
        url="",
        text="\n\n".join(sentences)[:SNIPPET_CHARS],
        score=expert.score,
        tool="who_knows",
        metadata={
            "person": expert.name,
            "aliases": list(expert.aliases),
            "score": round(expert.score, 4),
            "named_in": list(expert.named_in),
            "documents": [
                {
                    "document_id": ev.document_id,
                    "external_id": ev.external_id,
                    "source_public_id": ev.source_public_id,
                    "title": ev.title,
                    "kind": ev.kind,
                    "location": ev.location,
                    "path": ev.path,
                    "link": ev.link,
                    "role": ev.metadata.get("role"),
                    "credit": ev.metadata.get("credit"),
                }
                for ev in expert.documents
            ],
        },
        lexical_rank=min(ranks) if ranks else None,
        similarity=max(similarities) if similarities else None,
    )


@register(
    "who_knows",
    "People who know about the question (authors, reviewers, commenters, committers of the best matches), "
    "ranked, with the documents behind each.",
)
def who_knows_tool(*, query: str, scope: QueryScope, limit: int = 10) -> list[Evidence]:
    """Evidence for the pipeline: first one ``person`` row per top expert (at most
    ``PERSON_ROWS``; see :func:`person_evidence`), then the documents that earned the experts'
    scores, deduplicated, in expert order then credit order. At most ``limit`` rows (unnumbered).
    """
    experts = who_knows(query=query, scope=scope, limit=max(limit, PERSON_ROWS))
    rows = [person_evidence(expert) for expert in experts[:PERSON_ROWS]][:limit]
    seen: set[int] = set()
    for expert in experts:
        for ev in expert.documents:
            if len(rows) >= limit:
                return rows
            if ev.document_id not in seen:
                seen.add(ev.document_id)
                rows.append(ev)
    return rows
