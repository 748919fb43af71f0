"""Passages: the sentences and lines of the evidence, scored against the question.

The gate reads them to decide whether one passage holds the question's terms and meaning
together; the extractive synthesizer quotes the best of them. Scored once per question:

- **term coverage**: the share of the question's content terms a text holds, each term weighted
  by its inverse document frequency in the scope, ``idf(t) = ln((N + 1) / (df(t) + 1))`` (Spärck
  Jones, 1972; +1 so a term no row holds weighs most, not infinity). Terms are PostgreSQL's
  English lexemes (``to_tsvector('english', ...)``), the ones full-text search and the term
  statistics use, so "dependencies" meets "dependency"; stop words, the question's function
  words (``FUNCTION_WORDS``) and the words naming the kind of thing it asks for
  (``answer_types.answer_form_words``: "Which *function* ...", "What *pull request* ...") never
  count, nor, once people are credited for it, the phrase asking who knows a topic
  (:func:`credits_people`: "Who *can I ask* about ...").
- **similarity**: the cosine between the question's embedding and the passage's (prefixed with
  its block's title), from the embedder retrieval already loaded.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from django.db import connection

from search.pipeline.answer_types import answer_form_words, asks_for_document
from search.pipeline.evidence import PASSAGE_GAP, SNIPPET_CHARS, Evidence, query_passage
from search.pipeline.expertise import expertise_words
from search.pipeline.subquestions import SubQuestion, sub_questions
from search.text import WORD, neutralize_citations, word_variants
from sources.connectors.slack.messages import TRANSCRIPT_KINDS, TRANSCRIPT_STAMP

PASSAGE_MIN_CHARS = 25
PASSAGE_MAX_CHARS = 360
BLOCKS_READ = 5  # relevant evidence blocks whose passages are scored (retrieval order)
EMBEDDED_PER_BLOCK = 2  # of each block's passages, the best-covered ones are embedded
CODE_KINDS = frozenset({"code_chunk", "code_file"})
AUTHORED_TITLE_KINDS = frozenset({"commit", "pr"})  # whose title is the message's subject line
# Files in a repository written as prose: read as sentences, not as lines of code.
PROSE_LANGUAGES = frozenset({"markdown", "rst", "text", "asciidoc"})

# Closed-class English words (pronouns, determiners, conjunctions, modals, adverbial connectives;
# not prepositions, which may name a topic: "behind a proxy") and the tails of contractions
# ("I'm" -> "m", "you'll" -> "ll") that PostgreSQL's English stop list keeps as lexemes. They
# carry no topic, yet a word rare in the scope's rows weighs as a rare question term: "whose"
# weighed as much as a term no row holds. (Closed classes after Quirk et al., "A Comprehensive
# Grammar of the English Language", 1985.) See :func:`function_words`.
FUNCTION_WORDS = frozenset(
    """whose whether yet also either neither else ever anything something nothing everything someone
    anyone everyone somebody anybody everybody whatever whichever whoever however therefore thus hence might
    must shall could would ought one ones another""".split()
)
_CONTRACTION = re.compile(r"[^\W\d_]['’](m|d|ll|ve|re)\b", re.I)


def function_words(question: str) -> list[str]:
    """The words of ``question`` that are no question terms: each of ``FUNCTION_WORDS`` it holds,
    except an interrogative "whose" (opening the question or one of its sentences: "Whose job is
    it ...?" asks for a person), and each contraction tail it writes as one ("I'm", "we'd"; the
    "D" of "D-Bus" or the "M" of "the M key" stays a term)."""
    words, asking = set(), False
    for match in WORD.finditer(question):
        word = match.group(0).lower()
        if word in FUNCTION_WORDS:
            words.add(word)
            before = question[: match.start()].rstrip()
            asking = asking or (word == "whose" and (not before or before[-1] in ".!?;:"))
    words |= {m.group(1).lower() for m in _CONTRACTION.finditer(question)}
    return sorted(words - {"whose"} if asking else words)


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'`(])")
_FENCE = re.compile(r"```([^\n]*)\n(.*?)(?:```|\Z)", re.S)
DIAGRAM_FENCES = frozenset({"mermaid", "plantuml", "dot", "graphviz"})  # drawings, not code to quote
_HEADING = re.compile(r"^\s{0,3}(?:#{1,6}|h[1-6]\.)\s+")  # Markdown, or Confluence wiki markup ("h2. Root cause")
# Attribute lists ("{ #anchor }"), HTML tags a page may use inline (their text stays; a "<public id>"
# placeholder is no tag and stays), list and quote markers, bold markers.
_HTML_TAGS = (
    "a|abbr|b|br|cite|code|dd|del|details|dfn|div|dl|dt|em|i|img|ins|kbd|li|mark|ol|p|pre|q|s|samp|small|span|"
    "strong|sub|summary|sup|table|tbody|td|th|thead|time|tr|u|ul|var|h[1-6]"
)
_MARKUP = re.compile(
    r"\{\s*[#.][^{}\n]{0,80}\}|</?(?:" + _HTML_TAGS + r")\b[^<>\n]{0,200}>|^\s*(?:[-*+>|]|\d+\.)\s+|\*\*",
    re.I,
)
# Lines a connector writes itself, listing rather than saying ("Files changed: a.py b.py").
_LISTING = re.compile(r"^(?:Files changed|Changed files):", re.I)
_GAP = re.compile(r"\s*…\s*")


@dataclass
class Passage:
    """One sentence (or a few short ones), or one or a few lines of code, of an evidence block.

    ``n`` is the block's number; ``order`` its position in the block; ``code`` whether it is
    code (quoted as such); ``heading`` whether it is a title line (never an answer by itself);
    ``whole`` false for a sentence the evidence's query-biased excerpt cut (it starts in
    lower case or stops without its end), or a listing a connector wrote.
    """

    n: int
    text: str
    order: int
    code: bool = False
    heading: bool = False
    whole: bool = True  # a statement as written: not cut by a passage gap, not a listing
    after_gap: bool = False  # the first passage after the excerpt's gap (what came before it is not shown)
    lexemes: frozenset[str] = frozenset()
    coverage: float = 0.0  # IDF-weighted share of the question's terms it holds (with its block's title)
    similarity: float | None = None  # cosine to the question; None when not embedded


@dataclass
class ClauseScores:
    """How each scored passage answers one asked clause of the question (``subquestions``).

    ``coverage[i]``: the share of the clause's terms, each weighted by its IDF in the scope
    (``ScoredEvidence.weights``; equally when every one of them is in every readable row), that
    passage ``i`` of ``ScoredEvidence.passages`` holds with its block's title; ``similarity[i]``
    the cosine between the clause and passage ``i``, for the passages embedded
    (``_embed_passages``)."""

    sub: SubQuestion
    lexemes: frozenset[str]
    coverage: dict[int, float] = field(default_factory=dict)
    similarity: dict[int, float] = field(default_factory=dict)


@dataclass
class ScoredEvidence:
    """The question's terms with their weights, and each read block's passages and coverage.

    ``weights`` maps each question lexeme to its IDF normalised by ``ln(N + 1)`` (0..1: 1 for a
    term no row in the scope holds). ``block_coverage[n]`` is the share of the question's weight
    block ``n`` holds (title, text and context together); ``passages`` are all scored passages,
    in block then text order.
    """

    weights: dict[str, float]
    block_lexemes: dict[int, frozenset[str]] = field(default_factory=dict)
    block_coverage: dict[int, float] = field(default_factory=dict)
    passages: list[Passage] = field(default_factory=list)
    margin: float = 0.0  # how far the best embedding match stands out (search.pipeline.gate)
    small_scope: bool = False  # the scope holds too few rows for the margin to mean anything
    block_score: dict[int, float] = field(default_factory=dict)  # retrieval score / the best read block's
    clauses: list[ClauseScores] = field(default_factory=list)  # one per asked clause (subquestions)
    # The lexemes of the sentences that ask (each asked clause with the words leading it): a term
    # only the question's other sentences hold describes the asker's situation (gate.asked_weights).
    asked_lexemes: frozenset[str] = frozenset()
    # The words asking who knows a topic ("knows", "can I ask"), when the who_knows tool credited
    # people for its evidence (:func:`credits_people`): no term here, and no focus for the gate.
    credited_asking: tuple[str, ...] = ()

    def coverage_of(self, lexemes: frozenset[str] | set[str], weights: dict[str, float] | None = None) -> float:
        """The share of the question's weight (``weights``, by default ``self.weights``) ``lexemes`` hold."""
        weights = self.weights if weights is None else weights
        total = sum(weights.values())
        return sum(w for t, w in weights.items() if t in lexemes) / total if total else 0.0

    def missing_from(self, n: int, weights: dict[str, float] | None = None) -> list[tuple[str, float]]:
        """The question's lexemes block ``n`` lacks, ``(lexeme, weight)``, heaviest first (``weights``,
        by default ``self.weights``)."""
        weights = self.weights if weights is None else weights
        held = self.block_lexemes.get(n, frozenset())
        return sorted(((t, w) for t, w in weights.items() if t not in held), key=lambda tw: (-tw[1], tw[0]))


ANSWERING_PASSAGES = 5  # passages by coverage where an answer of the asked form must appear
ANSWERING_RELATIVE_COVERAGE = 0.5  # ... each holding at least this share of the best one's coverage


def answering_passages(scored: ScoredEvidence, *, top: int = ANSWERING_PASSAGES) -> list[Passage]:
    """Where an answer to the question would be: the ``top`` passages holding the most of the
    question's weight (at least ``ANSWERING_RELATIVE_COVERAGE`` of the best one's), each with the
    passage before and after it in its block, in block then text order. An answer candidate is
    looked for in the passages that match the question, not anywhere in the evidence (answer
    extraction from the top-ranked passages, Moldovan et al., ACL 2000): a version another ticket
    states is no answer to this one."""
    passages = scored.passages
    ranked = sorted(range(len(passages)), key=lambda i: (-passages[i].coverage, i))[:top]
    if ranked:
        floor = ANSWERING_RELATIVE_COVERAGE * passages[ranked[0]].coverage
        ranked = [i for i in ranked if passages[i].coverage >= floor]
    near: set[int] = set()
    for i in ranked:
        for j in (i - 1, i, i + 1):
            if 0 <= j < len(passages) and passages[j].n == passages[i].n:
                near.add(j)
    return [passages[i] for i in sorted(near)]


def credits_people(question: str, evidence: Sequence[Evidence]) -> bool:
    """Whether ``question`` asks who knows a topic or did a piece of work
    (``expertise.EXPERTISE_WITHOUT_FOCUS``) and the ``who_knows`` tool credited people for the
    evidence that answers it: a relevant ``person`` block credited by one of the first
    ``BLOCKS_READ`` relevant other blocks (``metadata["documents"]``). Then the people are the
    answer, so the asking words ("knows", "can I ask", "set up") are neither a term the evidence
    must hold nor the question's focus. Otherwise the question is read as any other ("Who set up
    the VPN?" needs a passage saying so): people credited only by documents further down, when
    the best evidence has no author (a package's source without its history), are no answer."""
    if not expertise_words(question):
        return False
    best = {
        i
        for ev in [ev for ev in evidence if ev.kind != "person" and ev.is_relevant][:BLOCKS_READ]
        for i in ev.document_ids
    }
    for ev in evidence:
        if ev.kind == "person" and ev.is_relevant:
            documents = [d for d in ev.metadata.get("documents") or [] if isinstance(d, dict) and d.get("credit")]
            if any(d.get("document_id") in best for d in documents):
                return True
    return False


def is_code(ev: Evidence) -> bool:
    """A block of source code (a code row not written in a prose language such as Markdown)."""
    return ev.kind in CODE_KINDS and str(ev.metadata.get("language") or "") not in PROSE_LANGUAGES


def block_passages(ev: Evidence, *, subject_line: bool = False, text: str | None = None) -> list[Passage]:
    """``ev``'s text cut into passages: prose into sentences (short ones joined up to
    ``PASSAGE_MAX_CHARS``), fenced code and code blocks into runs of lines, headings kept apart
    and marked. Citations written in the prose become ``(n)`` (code is left as written: it is
    only ever quoted inside a fenced block, where no ``[n]`` is a citation); markup is dropped.
    With ``subject_line``, the title of a commit or pull request, its author's first sentence and
    not a heading, is the block's first passage (a commit's text may be no more than the files it
    changed): for a question asking which commit or pull request did something, it is the answer."""
    text = (ev.text if text is None else text) or ""
    if is_code(ev):  # code is quoted as code: its "[1]" is a list, not a citation
        return _code_passages(ev.n, text, 0)
    prose = _transcript_passages if ev.kind in TRANSCRIPT_KINDS else _prose_passages
    out: list[Passage] = []
    if subject_line and ev.kind in AUTHORED_TITLE_KINDS and ev.title.strip():
        out.extend(_prose_passages(ev.n, neutralize_citations(" ".join(ev.title.split())), 0))
    pos = 0
    for match in _FENCE.finditer(text):
        out.extend(prose(ev.n, neutralize_citations(text[pos : match.start()]), len(out)))
        if match.group(1).strip().lower() not in DIAGRAM_FENCES:
            out.extend(_code_passages(ev.n, match.group(2), len(out)))
        pos = match.end()
    out.extend(prose(ev.n, neutralize_citations(text[pos:]), len(out)))
    return out


def _prose_passages(n: int, text: str, order: int) -> list[Passage]:
    out: list[Passage] = []
    pending = ""
    for raw in re.split(r"\n\s*\n|\n(?=\s{0,3}(?:#{1,6}\s|[-*+]\s|\d+\.\s))|" + _GAP.pattern, text):
        # A heading is its own line; what follows it is one paragraph, however it was wrapped.
        for line in raw.split("\n", 1) if _HEADING.match(raw) else [raw]:
            if _HEADING.match(line):
                if pending:
                    out.append(Passage(n=n, text=pending, order=order + len(out)))
                    pending = ""
                heading = _clean(_HEADING.sub("", line))
                if heading:
                    out.append(Passage(n=n, text=heading, order=order + len(out), heading=True))
                continue
            for sentence in _SENTENCE_END.split(_clean(line)):
                sentence = sentence.strip()
                if not sentence:
                    continue
                if (
                    pending
                    and len(pending) + len(sentence) + 1 <= PASSAGE_MAX_CHARS
                    and len(pending) < PASSAGE_MIN_CHARS
                ):
                    pending = f"{pending} {sentence}"
                    continue
                if pending:
                    out.append(Passage(n=n, text=pending, order=order + len(out)))
                pending = sentence[: PASSAGE_MAX_CHARS * 2]
        if pending:
            out.append(Passage(n=n, text=pending, order=order + len(out)))
            pending = ""
    for p in out:
        p.whole = p.heading or _is_whole(p.text)
    return [p for p in out if p.heading or len(p.text) >= PASSAGE_MIN_CHARS // 2]


# A chat message's head: its time stamp (``transcript_line``) or its author ("Name: ", at most four words).
_MESSAGE_HEAD = re.compile(TRANSCRIPT_STAMP.pattern + r"|^[^\s:]{1,40}(?: [^\s:]{1,40}){0,3}: ")


def _transcript_passages(n: int, text: str, order: int) -> list[Passage]:
    """A chat transcript's passages: one per message (a line; its indented continuation lines
    joined to it), a long message cut into sentences and a sentence longer than
    ``PASSAGE_MAX_CHARS`` at word boundaries (nothing is dropped). A message is a statement as
    written though chat rarely ends one with a full stop: it is ``whole`` from its head
    (``YYYY-MM-DD HH:MM`` or ``Name:``) on. A piece after the excerpt's gap (``PASSAGE_GAP``)
    starts inside a message (its ``after_gap`` is set), so only a time stamp makes its first
    line a head; otherwise a passage is whole only as a sentence (:func:`_is_whole`)."""
    out: list[Passage] = []
    for k, piece in enumerate(text.split(PASSAGE_GAP)):
        messages: list[str] = []
        for line in piece.split("\n"):
            if messages and line[:1].isspace() and line.strip():
                messages[-1] = f"{messages[-1]} {line.strip()}"
            elif line.strip():
                messages.append(line.strip())
        for m, message in enumerate(messages):
            cut_open = k > 0 and m == 0  # the excerpt's piece may start inside this message
            head = bool(TRANSCRIPT_STAMP.match(message) if cut_open else _MESSAGE_HEAD.match(message))
            cleaned = _clean(message)
            sentences = [cleaned] if len(cleaned) <= PASSAGE_MAX_CHARS else _SENTENCE_END.split(cleaned)
            for i, sentence in enumerate(c for s in sentences for c in _word_chunks(s.strip(), PASSAGE_MAX_CHARS)):
                if len(sentence) >= PASSAGE_MIN_CHARS // 2:
                    whole = (head and i == 0) or _is_whole(sentence)
                    passage = Passage(n=n, text=sentence, order=order + len(out), whole=whole)
                    passage.after_gap = cut_open and i == 0
                    out.append(passage)
    return out


def _word_chunks(text: str, size: int) -> list[str]:
    """``text`` in pieces of at most ``size`` characters cut at spaces (a word longer than
    ``size`` is cut inside); ``[text]`` when it fits."""
    chunks: list[str] = []
    while len(text) > size:
        cut = text.rfind(" ", 0, size + 1)
        cut = cut if cut > 0 else size
        chunks.append(text[:cut].rstrip())
        text = text[cut:].lstrip()
    return [*chunks, text] if text else chunks


_ENDS = ".!?:;)\"'`*”’"


def _is_whole(text: str) -> bool:
    """A statement as written: it starts with no lower-case letter (a code span may start it) and
    ends with a sentence's end, and is no connector-written listing."""
    if _LISTING.match(text):
        return False
    first = re.search(r"[^\W_]|`", text)
    if first is not None and first.group(0).islower():
        return False
    return text.rstrip()[-1:] in _ENDS


def _clean(text: str) -> str:
    """Markup dropped, code spans kept (an odd backtick dropped), whitespace collapsed."""
    text = _MARKUP.sub(" ", text)
    if text.count("`") % 2:
        text = text.replace("`", "")
    return re.sub(r"\s+([.,;:!?])(?=\s|$)", r"\1", " ".join(text.split()))


def _code_passages(n: int, code: str, order: int) -> list[Passage]:
    """Runs of up to 3 non-blank lines, each run one passage (its lines kept as they are)."""
    lines = [line.rstrip() for line in code.splitlines()]
    out: list[Passage] = []
    run: list[str] = []
    for line in lines + [""]:
        if line.strip() and len(run) < 3:
            run.append(line)
            continue
        if run:
            out.append(Passage(n=n, text="\n".join(run), order=order + len(out), code=True))
        run = [line] if line.strip() else []
    return out


EMBEDDED_CHARS = 200  # of a passage embedded (~50 tokens): 10 passages cost ~150 ms on one core


def embedding_text(title: str, text: str) -> str:
    """What is embedded for a passage: its block title's last part (a page's heading, not its
    whole path) and the passage's first ``EMBEDDED_CHARS`` characters."""
    heading = title.rsplit(" > ", 1)[-1][:80]
    text = TRANSCRIPT_STAMP.sub("", text)  # a chat message's time stamp says nothing about its meaning
    return f"{heading}: {' '.join(text.split())[:EMBEDDED_CHARS]}"


def lexeme_sets(texts: Sequence[str]) -> list[frozenset[str]]:
    """PostgreSQL's English lexemes of each text (``to_tsvector('english', text)``), in order.

    One statement for all texts; reads no table, so it needs no tenant context."""
    if not texts:
        return []
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tsvector_to_array(to_tsvector('english', t)) FROM unnest(%s::text[]) WITH ORDINALITY AS u(t, i) "
            "ORDER BY i",
            [[t.replace("\x00", " ") for t in texts]],
        )
        return [frozenset(row[0]) for row in cursor.fetchall()]


def _term_variants(question_lexemes: frozenset[str], pair_lexemes: list[frozenset[str]]) -> dict[str, frozenset[str]]:
    """``{question lexeme: lexemes of its other spellings}`` from the lexemes of (word, variant)
    pairs in order (``search.text.word_variants``)."""
    variants: dict[str, frozenset[str]] = {}
    for word_lex, variant_lex in zip(pair_lexemes[::2], pair_lexemes[1::2], strict=True):
        for lexeme in word_lex & question_lexemes:
            variants[lexeme] = variants.get(lexeme, frozenset()) | (variant_lex - word_lex)
    return variants


def _with_variants(lexemes: frozenset[str], variants: dict[str, frozenset[str]]) -> frozenset[str]:
    """``lexemes`` with each question lexeme one of whose other spellings they hold: a page writing
    "behavior" or "authentication" holds the question's "behaviour" or "auth"."""
    held = {lexeme for lexeme, others in variants.items() if others & lexemes}
    return lexemes | held if held else lexemes


def question_weights(question_lexemes: frozenset[str], df: dict[str, int], n_rows: int) -> dict[str, float]:
    """``{lexeme: idf / ln(N + 1)}`` for the question's lexemes (see the module docstring).

    A hyphenated or slashed compound (``built-in``, ``read-only``) whose parts the question also
    yields is left out: its parts carry it, and a text writing "built in" still holds them."""
    log_n = math.log(n_rows + 1) or 1.0
    weights = {}
    for lexeme in question_lexemes:
        parts = [p for p in re.split(r"[-/]", lexeme) if p]
        if len(parts) > 1 and any(p in question_lexemes for p in parts):
            continue
        weights[lexeme] = math.log((n_rows + 1) / (df.get(lexeme, 0) + 1)) / log_n
    return weights


CLAUSE_CANDIDATES = 5  # of each clause's best-covered passages, this many are embedded
MAX_CLAUSES = 3  # asked clauses scored apart (a longer list of questions is rare; the rest go unscored)
READ_CHARS = 4 * SNIPPET_CHARS  # of a block, what its passages are read from (see read_text)


def clause_score(scored: ScoredEvidence, clause: ClauseScores, i: int) -> float:
    """How well passage ``i`` answers ``clause``, in 0..1: the mean of the passage's clause
    coverage, its similarity to the clause (0 when not embedded) and its block's coverage of the
    whole question, times the block's retrieval score relative to the best read block
    (``ScoredEvidence.block_score``). The passage must answer the clause, and its document must be
    the one the question is about, which the clause may leave to its context or to a pronoun
    ("which team owns *it*"): the block's coverage of the whole question carries most of that
    (fused retrieval scores of the top blocks lie close together, so their ratio only breaks
    near ties)."""
    p = scored.passages[i]
    answers = (clause.coverage.get(i, 0.0) + clause.similarity.get(i, 0.0) + scored.block_coverage.get(p.n, 0.0)) / 3
    return answers * scored.block_score.get(p.n, 0.0)


def read_text(question: str, ev: Evidence) -> str:
    """What block ``ev``'s passages are read from: code as the block shows it; other text as its
    whole row (``Evidence.body``) when that fits in ``READ_CHARS``, else the query-biased excerpt
    of that size (``evidence.query_passage``). The block's own text is an excerpt of a quarter of
    that for the reader, chosen for the whole question: the answer to a question's second clause
    ("..., and which team owns it?") is often further on in the same document."""
    if is_code(ev) or not ev.body:
        return ev.text
    return query_passage(question, ev.body, READ_CHARS)


def score_evidence(
    question: str,
    evidence: Sequence[Evidence],
    *,
    df: dict[str, int],
    n_rows: int,
    question_vector: Sequence[float] | None = None,
    embed: Callable[[list[str]], list[list[float]]] | None = None,
    clauses: Sequence[SubQuestion] | None = None,
) -> ScoredEvidence:
    """Score the passages of the first ``BLOCKS_READ`` relevant blocks of ``evidence`` against
    ``question``, each block's passages read from :func:`read_text`.

    ``df`` and ``n_rows`` are the scope's document frequencies and row count
    (``search.retrieval.query_terms``). Each asked clause of the question (``clauses``, by
    default ``subquestions.sub_questions``; at most ``MAX_CLAUSES``) gets its
    :class:`ClauseScores`. With ``question_vector`` and ``embed`` (texts -> unit vectors), the
    ``EMBEDDED_PER_BLOCK`` best-covered passages of each block get a ``similarity`` to the
    question, and the ``CLAUSE_CANDIDATES`` passages each clause covers best a similarity to the
    clause: at most ``BLOCKS_READ * EMBEDDED_PER_BLOCK + MAX_CLAUSES * (CLAUSE_CANDIDATES + 1)``
    texts, in one call (a transformer's cost grows with the tokens it reads: this is the gate's
    largest cost).
    """
    blocks = [ev for ev in evidence if ev.is_relevant][:BLOCKS_READ]
    subject_lines = asks_for_document(question)
    per_block = [block_passages(ev, subject_line=subject_lines, text=read_text(question, ev)) for ev in blocks]
    passages = [p for ps in per_block for p in ps]
    block_texts = [f"{ev.title}\n{ev.text}\n{ev.context}" for ev in blocks]
    every_clause = list(clauses if clauses is not None else sub_questions(question))
    asked = every_clause[:MAX_CLAUSES]
    clause_texts = [c.text for c in asked]
    asking = " ".join(f"{c.context} {c.text}" for c in every_clause)  # a fourth clause still asks
    variant_pairs = [(w, v) for w in sorted({w.lower() for w in WORD.findall(question)}) for v in word_variants(w)]
    variant_texts = [text for pair in variant_pairs for text in pair]
    credited_asking = tuple(expertise_words(question)) if credits_people(question, evidence) else ()
    not_terms = function_words(question) + answer_form_words(question) + list(credited_asking)
    lexemes = lexeme_sets(
        [" ".join(not_terms), question, asking, *clause_texts]
        + [*variant_texts, *block_texts]
        + [ev.title for ev in blocks]
        + [p.text for p in passages]
    )
    function_lex, lexemes = lexemes[0], lexemes[1:]
    q_lexemes, asking_lex = lexemes[0] - function_lex, lexemes[1]
    clause_lex, rest = lexemes[2 : 2 + len(clause_texts)], lexemes[2 + len(clause_texts) :]
    variant_lex, rest = rest[: len(variant_texts)], rest[len(variant_texts) :]
    variants = _term_variants(q_lexemes, variant_lex)
    block_lex, title_lex, passage_lex = (
        rest[: len(blocks)],
        rest[len(blocks) : 2 * len(blocks)],
        rest[2 * len(blocks) :],
    )
    scored = ScoredEvidence(
        weights=question_weights(q_lexemes, df, n_rows), asked_lexemes=asking_lex, credited_asking=credited_asking
    )
    top_score = max((ev.score for ev in blocks), default=0.0)
    titles = {}
    block_lex, title_lex, passage_lex = (
        [_with_variants(lx, variants) for lx in group] for group in (block_lex, title_lex, passage_lex)
    )
    for ev, lx, tl in zip(blocks, block_lex, title_lex, strict=True):
        scored.block_lexemes[ev.n] = lx
        scored.block_coverage[ev.n] = scored.coverage_of(lx)
        scored.block_score[ev.n] = ev.score / top_score if top_score > 0 else 1.0
        titles[ev.n] = (ev.title, tl)
    for p, lx in zip(passages, passage_lex, strict=True):
        p.lexemes = lx
        p.coverage = scored.coverage_of(lx | titles[p.n][1])
    scored.passages = passages
    scored.clauses = [ClauseScores(sub=c, lexemes=lx) for c, lx in zip(asked, clause_lex, strict=True)]
    for clause in scored.clauses:
        weights = {t: w for t, w in scored.weights.items() if t in clause.lexemes}
        if not any(weights.values()):  # every term in every readable row (a scope of a row or two): plain overlap
            weights = dict.fromkeys(weights, 1.0)
        total = sum(weights.values())
        for i, p in enumerate(passages):
            held = p.lexemes | titles[p.n][1]
            clause.coverage[i] = sum(w for t, w in weights.items() if t in held) / total if total else 0.0
    if question_vector is not None and embed is not None and passages:
        _embed_passages(question, scored, per_block, titles, question_vector, embed)
    return scored


def _embed_passages(
    question: str,
    scored: ScoredEvidence,
    per_block: list[list[Passage]],
    titles: dict[int, tuple[str, frozenset[str]]],
    question_vector: Sequence[float],
    embed: Callable[[list[str]], list[list[float]]],
) -> None:
    """Set ``Passage.similarity`` (to the question) for each block's ``EMBEDDED_PER_BLOCK``
    best-covered passages, and ``ClauseScores.similarity`` for those and each clause's
    ``CLAUSE_CANDIDATES`` best-covered ones, with one ``embed`` call. ``Passage.similarity`` is
    the gate's signal and stays the question's cosine to the first set alone."""
    passages = scored.passages
    chosen: list[Passage] = []
    for ps in per_block:
        candidates = [p for p in ps if not p.heading] or ps
        chosen.extend(sorted(candidates, key=lambda p: (-p.coverage, p.order))[:EMBEDDED_PER_BLOCK])
    question_read = {id(p) for p in chosen}
    for clause in scored.clauses:
        ranked = sorted((i for i, p in enumerate(passages) if not p.heading), key=lambda i: (-clause.coverage[i], i))
        chosen.extend(passages[i] for i in ranked[:CLAUSE_CANDIDATES])
    chosen = list({id(p): p for p in chosen}.values())
    # A clause that is the whole question is the question's vector; the others are embedded.
    whole = question.strip().rstrip("?").strip()
    apart = [c for c in scored.clauses if c.sub.text != whole]
    vectors = embed([embedding_text(titles[p.n][0], p.text) for p in chosen] + [c.sub.text for c in apart])
    if len(vectors) != len(chosen) + len(apart):
        raise ValueError(f"embed returned {len(vectors)} vectors for {len(chosen) + len(apart)} texts")
    clause_vectors = {id(c): v for c, v in zip(apart, vectors[len(chosen) :], strict=True)}
    index = {id(p): i for i, p in enumerate(passages)}
    for p, vector in zip(chosen, vectors[: len(chosen)], strict=True):
        if id(p) in question_read:
            p.similarity = _cosine(question_vector, vector)
        for clause in scored.clauses:
            clause.similarity[index[id(p)]] = max(0.0, _cosine(clause_vectors.get(id(clause), question_vector), vector))


def _cosine(a: Sequence[float], b: Sequence[float]) -> float:
    return float(sum(x * y for x, y in zip(a, b, strict=True)))
