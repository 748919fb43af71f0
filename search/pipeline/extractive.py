"""The extractive answer: without an LLM (or when it fails), the answer is composed from the
passages that best answer each asked clause of the question, each quoted with its ``[n]``
(:func:`extractive_answer`); a code answer quotes the signature and the lines that matter.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from search.pipeline.drafts import (
    Draft,
    code_span,
    decline_text,
    fence_language,
    gate_notes,
    markdown_quote,
    markdown_text,
    shortened,
)
from search.pipeline.evidence import RELEVANT_SIMILARITY, Evidence
from search.pipeline.gate import EMPTY_SCOPE, Verdict, named_terms
from search.pipeline.passages import ClauseScores, Passage, clause_score, is_code
from search.text import STEM_CHARS, STOP_WORDS, WORD, holds_term, neutralize_citations
from sources.connectors.slack.messages import TRANSCRIPT_KINDS

# -- the extractive answer ---------------------------------------------------------------------

EXTRACTIVE_PASSAGES = 3
EXTRACTIVE_RELATIVE_SCORE = 0.85  # a further passage must score this share of the best
EXTRACTIVE_BLOCKS = 2  # further passages come from the blocks of the best two passages at most
PER_BLOCK = 2
MIN_STATEMENT_CHARS = 40  # a shorter prose passage is a fragment ("The same applies for:"), not an answer
# ... unless it states a field of a record: a label of up to five words, a colon, a value ("Owning
# team: Eng Serving Runtime.", "Severity: P1"), as tickets, postmortems and forms write them.
_FIELD_LINE = re.compile(r"^[^\W\d_][\w'()/&.-]*(?: [\w'()/&.-]+){0,4}:\s+[^\s:]")
TYPED_RELATIVE_SCORE = 0.5  # a passage of the asked form answers a clause when it scores half its best
NEAR_TIE = 0.95  # a later clause's passages within this share of its best are near ties (see best_passages)
CODE_LINES_SHOWN = 12
_SIGNATURE = re.compile(r"^\s*(?:async\s+def|def|class|func|function|export\s+(?:async\s+)?function|public|private)\b")
_TABLE_ROW = re.compile(r"\|.*\|")
_WORD = re.compile(r"[^\W\d_]{2,}")
_REFERS_BACK = re.compile(r"\b(?:it|its|they|them|their|this|these|those)\b", re.I)  # a pronoun for what came before
_LISTING = re.compile(r"^(?:Files changed|Changed files):", re.I)  # what a connector lists, not says


def passage_score(p: Passage) -> float:
    """How well a passage answers: the mean of its term coverage and its similarity (a passage
    that was not embedded counts its coverage alone, halved)."""
    return (p.coverage + (p.similarity if p.similarity is not None else 0.0)) / 2


def _quotable(p: Passage, *, whole_only: bool = True) -> bool:
    """A passage that can stand in an answer: no heading, no table row, no fragment, and (with
    ``whole_only``) no sentence the evidence excerpt cut (``Passage.whole``)."""
    if p.heading:
        return False
    if p.code:  # a run of lines holding no word ("    )", "}") says nothing, whatever its title holds
        return bool(_WORD.search(p.text))
    if _LISTING.match(p.text) or _TABLE_ROW.search(p.text):
        return False
    if len(p.text) < MIN_STATEMENT_CHARS and not is_field_line(p.text):
        return False
    return p.whole or not whole_only


def is_field_line(text: str) -> bool:
    """Whether ``text`` is a record's "Label: value" line (``_FIELD_LINE``), not one introducing
    what follows."""
    return bool(_FIELD_LINE.match(text)) and not introduces(text)


def _speaks_to(p: Passage, clause: ClauseScores | None) -> bool:
    """Whether a short field line holds one of ``clause``'s words ("Owning *team*: ..." for "which
    team owns it", "Priya (2025-02-11): *Approved*" for "who approved it"): only then is a line that
    short an answer to it ("alice: +1", "Status: open" are none). A passage long enough to be a
    statement, code, or no field line, passes."""
    if len(p.text) >= MIN_STATEMENT_CHARS or p.code or not is_field_line(p.text):
        return True
    if clause is None:
        return False
    words = [w for w in WORD.findall(clause.sub.text) if len(w) > 2 and w.lower() not in STOP_WORDS]
    return any(holds_term(p.text, w) or holds_term(p.text, w[:STEM_CHARS]) for w in words)


_REFERENCE_END = re.compile(r"\s*\((?:#|PR\s*#?)?\d+\)$", re.I)


def said_key(text: str) -> str:
    """What a passage says, for quoting it once: lower-cased, spaces collapsed, a trailing
    reference ("(#16013)") and a closing full stop, colon or semicolon dropped, so a commit's
    subject and the release note copying it ("... `/users/john.doe`.") are one. A question mark
    stays: "Restart the workers?" and its confirming reply "Restart the workers." are two."""
    said = " ".join(text.lower().split()).rstrip(" .;:")
    return _REFERENCE_END.sub("", said).rstrip(" .;:")


def best_passages(question: str, evidence: Sequence[Evidence], verdict: Verdict) -> list[Passage]:
    """The passages the extractive answer quotes, in the order their blocks first rank, then text
    order.

    Each asked clause of the question (``passages.ClauseScores``: "what watchdog did we add" and
    "which team owns it" are two) gets its best passage by ``passages.clause_score``: of the
    passages scoring at least ``TYPED_RELATIVE_SCORE`` of its best, one holding a value of the
    form the clause asks for when any does; a later clause's near ties (``NEAR_TIE``) go to the
    passage nearest the earlier clause's in its block; from a block no earlier clause was quoted
    from, only a passage holding one of the clause's terms or close to it in meaning. A question
    of one clause gets up to ``EXTRACTIVE_PASSAGES`` scoring at least
    ``EXTRACTIVE_RELATIVE_SCORE`` of its best. At most ``PER_BLOCK`` per block (or one per
    clause, when more), from at most ``EXTRACTIVE_BLOCKS`` blocks (one more per further clause).
    Never a heading, a table row, a fragment (a short "Label: value" line is none when it holds a
    word of the clause), a run of code lines holding no word, a sentence introducing code
    that is not shown, or a sentence already quoted from another block. When a clause names
    identifiers (``search.pipeline.gate.named_terms``, with those of the question's context
    sentences, and the earlier clause's when it refers back with a pronoun) and some block holds
    one, only such blocks are quoted for it (a citation never points at a block lacking what was
    asked). In a chat transcript the message after a quoted one (its reply) is quoted too when it
    holds any of the question's terms."""
    scored = verdict.scored
    candidates = scored.passages if scored else []
    # Whole sentences when there are any; else the excerpt's cut ones (quoted with "…").
    passages = [p for p in candidates if _quotable(p)] or [p for p in candidates if _quotable(p, whole_only=False)]
    # A sentence introducing code the evidence does not show ("... like this:") cannot be quoted.
    passages = [p for p in passages if p.code or not introduces(p.text) or _following_code(p, candidates)]
    by_n = {ev.n: ev for ev in evidence}
    if not passages:
        return []
    chosen: list[Passage] = []
    per_block: dict[int, int] = {}
    said: set[str] = set()  # one page copied into another says the same sentence twice: quote it once
    clauses: list[ClauseScores | None] = list(scored.clauses) if scored and scored.clauses else [None]
    index = {id(p): i for i, p in enumerate(candidates)}
    read = {id(candidates[i]) for c in clauses if c is not None for i in c.similarity}
    blocks_allowed = EXTRACTIVE_BLOCKS + len(clauses) - 1
    per_block_allowed = max(PER_BLOCK, len(clauses))
    named = named_terms(question)
    # Each identifier looked for once in each block's title and read text (bodies run to 100 KB).
    blocks = {t: {n for n, ev in by_n.items() if holds_term(f"{ev.title}\n{ev.text}\n{ev.body}", t)} for t in named}
    own = {id(c): set(named_terms(f"{c.sub.context} {c.sub.text}")) for c in clauses if c is not None}

    def clause_named(clause: ClauseScores | None) -> tuple[list[str], list[str]]:
        # The identifiers the question names outside its other clauses: its context sentences'
        # ("During the VPC-17 rollout, ...") bind every clause, another clause's do not. A clause
        # referring back ("..., and who reviewed *it*?") is bound to the earlier clauses' too, as
        # blocks: the passage answering it need not repeat the identifier.
        if clause is None:
            return named, []
        others = set().union(*(ids for key, ids in own.items() if key != id(clause)))
        mine = [t for t in named if t in own[id(clause)] or t not in others]
        inherited: list[str] = []
        if _REFERS_BACK.search(clause.sub.text):
            earlier = set().union(*(own[id(c)] for c in clauses if c is not None and c.sub.index < clause.sub.index))
            inherited = [t for t in named if t in earlier and t not in mine]
        return mine, inherited

    for clause in clauses:
        taken = {id(p) for p in chosen}
        mine, inherited = clause_named(clause)
        pool = _holding_named([p for p in passages if id(p) not in taken], mine, blocks, read)
        pool = _holding_named(pool, inherited, blocks, read, blocks_only=True)
        pool = [p for p in pool if _speaks_to(p, clause)]
        if clause is None or scored is None:  # nothing scored per clause (a bare verdict)
            score = {id(p): passage_score(p) for p in pool}
        else:
            score = {id(p): clause_score(scored, clause, index[id(p)]) for p in pool}
            if len(clauses) > 1:
                # From a document no earlier clause was answered from, only a passage that speaks to
                # the clause (one of its terms, or close in meaning): a clause nothing speaks to gets
                # no quote from an unrelated page. In the earlier clause's document a short clause
                # leaning on it ("and how did they fix *it*?") is often answered in other words.
                pool = [
                    p
                    for p in pool
                    if p.n in per_block
                    or clause.coverage.get(index[id(p)], 0.0) > 0
                    or clause.similarity.get(index[id(p)], 0.0) >= RELEVANT_SIMILARITY
                ]
            # Answer-type filtering of factoid QA (Moldovan et al., ACL 2000): among the passages
            # scoring at least half the clause's best, those holding a value of the form it asks for.
            asked = clause.sub.asked
            top = max((score[id(p)] for p in pool), default=0.0)
            typed = [
                p
                for p in pool
                if asked is not None and asked.held_by(p.text) and score[id(p)] >= TYPED_RELATIVE_SCORE * top
            ]
            pool = typed or pool
        ranked = sorted(pool, key=lambda p: (-score[id(p)], p.n, p.order))
        if not ranked:
            continue
        best = score[id(ranked[0])]
        if chosen and len(clauses) > 1:
            # A later clause is about what the earlier one found ("..., and which team owns *it*"):
            # of its near ties, the passage nearest the earlier clause's in the same block, as a
            # pronoun's antecedent is most often the nearest (Hobbs, "Resolving pronoun
            # references", Lingua 1978); an action item's owner is the line after it.
            last = chosen[-1]
            ties = [p for p in ranked if score[id(p)] >= NEAR_TIE * best]
            # At equal distance the passage after it: a record's fields follow what they describe.
            ties.sort(
                key=lambda p: (False, abs(p.order - last.order), p.order < last.order)
                if p.n == last.n
                else (True, 0, False)
            )
            ranked = ties + [p for p in ranked if score[id(p)] < NEAR_TIE * best]
        wanted = len(chosen) + (EXTRACTIVE_PASSAGES if len(clauses) == 1 else 1)
        for p in ranked:
            if len(chosen) >= wanted or score[id(p)] < EXTRACTIVE_RELATIVE_SCORE * best:
                break
            if per_block.get(p.n, 0) >= per_block_allowed or (
                p.n not in per_block and len(per_block) >= blocks_allowed
            ):
                continue
            key = said_key(p.text)
            if key in said:
                continue
            said.add(key)
            per_block[p.n] = per_block.get(p.n, 0) + 1
            chosen.append(p)
    # A chat message is read with its reply: a thread's first message asks, the next one answers
    # (the next shown message, not one the excerpt's gap separates from it).
    for p in list(chosen):
        if by_n[p.n].kind in TRANSCRIPT_KINDS and per_block[p.n] < per_block_allowed:
            reply = next((q for q in passages if q.n == p.n and q.order == p.order + 1 and not q.after_gap), None)
            key = said_key(reply.text) if reply is not None else ""
            if reply is not None and reply not in chosen and reply.coverage > 0 and key not in said:
                said.add(key)
                per_block[p.n] += 1
                chosen.append(reply)
    order = {n: i for i, n in enumerate(per_block)}  # blocks in the order their best passage ranked
    return sorted(chosen, key=lambda p: (order[p.n], p.order))


def _holding_named(
    pool: list[Passage], named: Sequence[str], blocks: dict[str, set[int]], read: set[int], *, blocks_only: bool = False
) -> list[Passage]:
    """``pool`` kept to the blocks holding one of the identifiers ``named`` (in their title or the
    text their passages are read from), when some block does: a citation never points at a block
    lacking what was asked (``blocks``: for each identifier, the numbers of the blocks holding
    it). Of those blocks (all their passages, with ``blocks_only``), the
    passages holding the identifier, code, or the passages read as close to the question
    (``Passage.similarity``) or to one of its clauses (``read``: ids of passages with a clause
    similarity)."""
    if not named:
        return pool
    holding = set().union(*(blocks[t] for t in named))
    if not holding:
        return pool
    if blocks_only:
        return [p for p in pool if p.n in holding]
    return [
        p
        for p in pool
        if p.n in holding
        and (p.code or any(holds_term(p.text, t) for t in named) or p.similarity is not None or id(p) in read)
    ]


_EMOJI_END = re.compile(r":[\w+-]+:$")  # ":thumbsup:" ends a chat line, it introduces nothing


def introduces(text: str) -> bool:
    """Whether ``text`` ends by introducing what follows it ("... like this:")."""
    text = text.rstrip()
    return text.endswith(":") and not _EMOJI_END.search(text)


def _following_code(p: Passage, scored_passages: Sequence[Passage]) -> list[Passage]:
    """The code right after ``p`` in its block (its consecutive code passages, at most
    ``CODE_LINES_SHOWN`` lines), when ``p`` introduces it ("... like this:"); else ``[]``."""
    if not introduces(p.text):
        return []
    same_block = {q.order: q for q in scored_passages if q.n == p.n}
    run: list[Passage] = []
    order, lines = p.order + 1, 0
    while order in same_block and same_block[order].code and lines < CODE_LINES_SHOWN:
        run.append(same_block[order])
        lines += same_block[order].text.count("\n") + 1
        order += 1
    return run


def _merge_headers(ev: Evidence) -> dict[str, dict]:
    """``{"### <location>": section}``: the line ``evidence._merge_section`` writes before each
    section merged into block ``ev``."""
    return {f"### {s.get('location')}": s for s in ev.sections if s.get("location")}


def _code_sections(ev: Evidence) -> list[tuple[str, str, list[str]]]:
    """The parts of code block ``ev``, each as ``(symbol, location, lines)``: its own row's,
    then each section merged into it (``evidence._merge_section`` writes one after a line
    ``### <location>``; a comment line that names no merged section stays code)."""
    headers = _merge_headers(ev)
    own = ev.metadata.get("symbol")
    parts: list[tuple[str, str, list[str]]] = [(str(own) if own else "", ev.location, [])]
    for line in ev.text.splitlines():
        section = headers.get(line.strip())
        if section is not None:
            title = str(section.get("title") or "")
            parts.append((title.split(": ", 1)[1] if ": " in title else "", str(section["location"]), []))
        else:
            parts[-1][2].append(line.rstrip())
    return parts


def _code_answer(ev: Evidence, passages: Sequence[Passage]) -> str:
    """A code block's answer: where it is, its signature, and the lines that matter (the chosen
    passages of the block, in order, once). A block holding several chunks of one file
    (:func:`_code_sections`) is quoted from the chunk the first chosen passage is in, named by
    that chunk's symbol and location: lines of another chunk are not shown under its name."""
    headers = _merge_headers(ev)
    runs = [
        [line.rstrip() for line in p.text.splitlines() if line.strip() and line.strip() not in headers]
        for p in sorted(passages, key=lambda q: q.order)
    ]
    runs = [run for run in runs if run]
    parts = _code_sections(ev)
    holding = next((part for part in parts if runs and runs[0][0] in part[2]), None)
    symbol, location, lines = holding or parts[0]
    if holding is not None and len(parts) > 1:  # only the lines of the chunk it is named by
        held = set(lines)
        runs = [kept for kept in ([line for line in run if line in held] for run in runs) if kept]
    where = code_span(location) if location else markdown_text(ev.title)
    name = f"{code_span(symbol)} in {where}" if symbol and not symbol.endswith(">") else where
    signature = next((line for line in lines if _SIGNATURE.match(line)), "")
    shown: list[str] = []
    for run in runs:
        if shown:
            shown.append("    ...")
        shown.extend(run)
    if signature and signature not in shown:
        shown = [signature, "    ..." if shown else "", *shown]
    body = "\n".join(line for line in shown[:CODE_LINES_SHOWN] if line)
    language = fence_language(ev.metadata.get("language"))
    return f"{neutralize_citations(name)} [{ev.n}]:\n```{language}\n{body.replace('```', '` ` `')}\n```"


PEOPLE_NAMED = 3


PERSON_DOCUMENTS_NAMED = 2  # of a person's credited documents, the first ones the answer line names
PERSON_TITLE_CHARS = 80
# What a role in a row says a person did with it (``search.tools.people``'s roles).
_ROLE_VERBS = {
    "author": "wrote",
    "reporter": "reported",
    "assignee": "was assigned",
    "creator": "created",
    "owner": "owns",
    "participant": "took part in",
    "reviewer": "reviewed",
    "collaborator": "collaborated on",
    "commenter": "commented on",
}
_KIND_WORDS = {"commit": "commit", "pr": "pull request", "doc_section": "page", "doc_page": "page"}


def _credit_phrase(document: dict) -> str:
    """What one credited document says the person did: "authored commit “Fix …”", "committed
    changes to `fastapi/routing.py`" (the author of commits to a file found), "took part in thread
    “…”"."""
    role = str(document.get("role") or "")
    kind = str(document.get("kind") or "")
    title = shortened(" ".join(str(document.get("title") or "").split()), PERSON_TITLE_CHARS)
    if role == "file author":
        path = str(document.get("path") or document.get("location") or title)
        return f"committed changes to {code_span(path)}"
    verb = "authored" if role == "author" and kind in ("commit", "pr") else _ROLE_VERBS.get(role, "is named in")
    noun = _KIND_WORDS.get(kind, kind.replace("_", " ") or "document")
    return f"{verb} {noun} “{markdown_text(neutralize_citations(title))}”"


def _person_line(ev: Evidence) -> str:
    """A who-knows block as its person and what they did with the documents that earned their
    credit: "**Ana Ruiz** authored commit “…” and committed changes to `x.py` (4 documents found)",
    the first ``PERSON_DOCUMENTS_NAMED`` of them (``metadata["documents"]``, most credit first).
    A block without that list is its credit line, the name once."""
    name = " ".join(ev.title.split())
    documents = [d for d in ev.metadata.get("documents") or [] if isinstance(d, dict) and d.get("credit")]
    if not documents:
        first = ev.text.split("\n", 1)[0].strip()
        line = first if name and first.startswith(name) else f"{name}: {first}"
        return markdown_text(neutralize_citations(line.rstrip(".")))
    phrases = [_credit_phrase(d) for d in documents[:PERSON_DOCUMENTS_NAMED]]
    found = f" ({len(documents)} documents found)" if len(documents) > len(phrases) else ""
    return f"**{markdown_text(neutralize_citations(name))}** {' and '.join(phrases)}{found}"


def _sentence(p: Passage) -> str:
    """A passage as a sentence of the answer: a cut one marked with "…" where it was cut."""
    text = markdown_quote(" ".join(neutralize_citations(p.text).split()))
    if not p.whole and text[:1].islower():
        text = "…" + text
    return (
        text
        if text[-1:] in ".!?:" and not (text[-1] == ":" and not introduces(text))
        else text + ("…" if not p.whole else ".")
    )


def extractive_answer(question: str, evidence: list[Evidence], *, verdict: Verdict) -> Draft:
    """The answer without an LLM, from the passages :func:`best_passages` picks.

    Prose passages become sentences, each followed by its block's ``[n]``, in one paragraph; a
    code passage becomes its block's location, signature and lines in a fenced block. A partial
    verdict opens with the gate's notes. A not-found verdict, or evidence with no passage worth
    quoting, is the plain decline (:func:`decline_text`)."""
    if verdict.status == "not_found" or not evidence:
        text = decline_text(
            evidence,
            no_evidence=not verdict.relevant,
            notes=gate_notes(verdict),
            empty_scope=verdict.decided_by == EMPTY_SCOPE,
        )
        return Draft(text=text, cited=[], synthesizer="extractive", answers=False)
    people = [ev for ev in evidence if ev.kind == "person" and ev.is_relevant][:PEOPLE_NAMED]
    chosen = [p for p in best_passages(question, evidence, verdict) if p.n not in {ev.n for ev in people}]
    if not chosen and not people:
        return Draft(text=decline_text(evidence), cited=[], synthesizer="extractive", answers=False)
    by_n = {ev.n: ev for ev in evidence}
    prose = [p for p in chosen if not (p.code or is_code(by_n[p.n]))]
    code = [p for p in chosen if p.code or is_code(by_n[p.n])]
    parts: list[str] = []
    if people:  # who knows: the people are the answer, each with their credit line
        parts.append("\n".join(f"- {_person_line(ev)} [{ev.n}]" for ev in people))
        prose, code = prose[:1], code[:0]
    all_passages = verdict.scored.passages if verdict.scored else []
    sentences: list[str] = []
    shown: set[tuple[int, int]] = set()  # (block, order) of code passages already quoted
    for p in prose:
        code_after = _following_code(p, all_passages)
        if not code_after and introduces(p.text):
            continue  # it introduces something not shown
        sentence = _sentence(p)
        sentences.append(f"{sentence[:-1]} [{p.n}]{sentence[-1]}")
        if code_after:
            parts.append(" ".join(sentences))
            sentences = []
            body = "\n".join(q.text for q in code_after).replace("```", "` ` `")
            parts.append(f"```\n{body}\n```")
            shown.update((q.n, q.order) for q in code_after)
    if sentences:
        parts.append(" ".join(sentences))
    code = [p for p in code if (p.n, p.order) not in shown][: 1 if prose else 2]
    for n in dict.fromkeys(p.n for p in code):  # one quote per block
        ev, mine = by_n[n], [p for p in code if p.n == n]
        if is_code(ev):
            parts.append(_code_answer(ev, mine))
        else:  # a code example inside a page
            heading = markdown_text(" ".join(neutralize_citations(ev.title.rsplit(" > ", 1)[-1]).split()))
            body = "\n".join(p.text for p in mine).replace("```", "` ` `")
            parts.append(f"{heading} [{n}]:\n```\n{body}\n```")
    if not parts:
        return Draft(text=decline_text(evidence), cited=[], synthesizer="extractive", answers=False)
    notes = gate_notes(verdict)
    note = " ".join(notes)
    text = "\n\n".join(([note] if note else []) + parts)
    cited = [n for n in dict.fromkeys([*(ev.n for ev in people), *(p.n for p in [*prose, *code])]) if f"[{n}]" in text]
    return Draft(text=text, cited=cited, synthesizer="extractive", answers=True, note=note)
