"""Text patterns the answer pipeline, its tools and retrieval share: citations, words and terms,
identifiers, stop words.

Words are Unicode: "Bienenstöcke" and "São" are one word each, never split at a non-ASCII letter.
"""

from __future__ import annotations

import re

# -- citations ----------------------------------------------------------------------------------

CITATION = re.compile(r"\[(\d+(?:\s*,\s*\d+)*)\]")  # "[2]", "[1, 3]": one citation, its numbers in group 1
CITATION_PREFIX = re.compile(r"\[(?:\d+(?:\s*,\s*\d+)*\s*(?:,\s*)?)?")  # what may still become a citation
_CITATION_LIKE = re.compile(r"\[\s*\d+(?:\s*,\s*\d+)*\s*\]")


def without_citations(text: str) -> str:
    """``text`` with every ``[n]`` / ``[n, m]`` replaced by a space."""
    return _CITATION_LIKE.sub(" ", text)


def neutralize_citations(text: str) -> str:
    """Document text made safe to quote in an answer or a prompt: a ``[3]`` of its own would read
    as one of our citations, so it becomes ``(3)``."""
    return _CITATION_LIKE.sub(lambda m: "(" + m.group(0)[1:-1].strip() + ")", text)


# -- words and terms ----------------------------------------------------------------------------

WORD = re.compile(r"(?:[^\W\d]|_)\w*")  # a Unicode word: a letter or "_" first, then letters, digits, "_"
STOP_WORDS = frozenset(
    """a an and are as at be by can do does for from has have how i if in is it its my of on or our so that the
    their then there these this to was we what when where which who whom whose why will with you your me should
    would could get use using about into out up any all one not no than way make sure find know need want
    tell us please""".split()
)
STEM_CHARS = 6  # content_terms' crude stem: the first 6 characters of a word
_WITH_DIGIT = re.compile(r"[^\W_][\w/.:-]*")


def content_terms(text: str) -> set[str]:
    """The content words of ``text``: lower-cased, stop words and words under 3 characters left out,
    each cut to its first ``STEM_CHARS`` characters (a crude stem: "deployments" and "deployed"
    meet); and whole, lower-cased, every token holding a digit ("6/1", "18:00", "eu-west-3",
    "v2.2.3"), trailing punctuation dropped, of 2 characters or more: dates, times, versions and
    ids are what many answers state. Unicode words stay whole ("bienenstöcke" -> "bienen")."""
    words = {w.lower()[:STEM_CHARS] for w in WORD.findall(text) if len(w) > 2 and w.lower() not in STOP_WORDS}
    numbers = {t.rstrip("/.:-").lower() for t in _WITH_DIGIT.findall(text) if any(c.isdigit() for c in t)}
    return words | {t for t in numbers if len(t) > 1}


# -- identifiers and specific terms -----------------------------------------------------------

# Spans a question quotes: `code`, "phrase", “phrase”.
QUOTED = re.compile(r"`([^`\n]{1,200})`|\"([^\"\n]{1,200})\"|“([^”\n]{1,200})”")
# An issue or pull request reference as GitHub, GitLab and commit subjects write it ("PR #16062",
# "fixes #812"): one item exactly, as a ticket key is. Digits only (a channel "#ops" is a name), at
# least three ("our #1 priority", "the #2 cause" rank, they name no issue).
ISSUE_REFERENCE = re.compile(r"(?<![\w&#/])#\d{3,7}\b")
# A token of a question: a Unicode word, with inner ".", "-", "/", "'" kept ("HTTP/3", "ZEBRA-4471").
TOKEN = re.compile(r"_*[^\W_][\w.\-/'’]*[^\W_]|[^\W_]")
# Numbers written with letters are still numbers: "401s", "1990s", "v2", "v2.2.x", "3.x".
_NUMBER_LIKE = re.compile(r"\d+s|v?\d+(?:\.(?:\d+|x))*", re.I)


def _is_specific(token: str, *, acronyms: bool = True) -> bool:
    """An identifier rather than a word: letters and digits mixed (``HTTP/3``, ``CO2e``, ``H100``,
    ``ZEBRA-4471``), ``snake_case``, ``camelCase`` / ``CamelCase`` with two humps, a dotted name
    (``app.state``), or an acronym of 2+ capitals (``CSRL``). A number is not, however written
    (``3.12``, ``401s``, ``v2.2.x``)."""
    letters = [c for c in token if c.isalpha()]
    if not letters or _NUMBER_LIKE.fullmatch(token):
        return False
    if any(c.isdigit() for c in token) or "_" in token.strip("_"):
        return True
    if re.search(r"[a-z][A-Z]", token) or re.search(r"\w\.\w", token):
        return True
    return acronyms and len(letters) >= 2 and all(c.isupper() for c in letters)


def specific_terms(question: str, *, acronyms: bool = True) -> list[str]:
    """The identifiers, codes and quoted phrases ``question`` names, in order, each once (case-insensitively):
    quoted or back-ticked spans whole, and tokens :func:`_is_specific` finds. These name one thing
    exactly, so evidence that does not hold them is about something else. ``acronyms=False``
    leaves out words in capitals (``PR``, ``README``, ``VPC``), which are often plain words."""
    found: list[str] = []
    seen: set[str] = set()

    def add(term: str) -> None:
        term = term.strip(" .,;:!?()[]{}'\"")
        if term and term.lower() not in seen:
            seen.add(term.lower())
            found.append(term)

    for match in QUOTED.finditer(question):
        add(next(g for g in match.groups() if g is not None))
    rest = QUOTED.sub(" ", question)
    for token in TOKEN.findall(rest):
        token = re.sub(r"['’]s$", "", token).strip(".-/'")  # "FastAPI's" names FastAPI
        parts = token.split("/")
        if len(parts) > 1 and all(_is_specific(p, acronyms=acronyms) for p in parts):
            for part in parts:  # "H100/A100" names two things
                add(part)
        elif token and _is_specific(token, acronyms=acronyms):
            add(token)
    return found


def holds_term(text: str, term: str) -> bool:
    """``term`` occurs in ``text`` as a whole token or as the first part of a longer identifier
    (``Jinja2`` in ``Jinja2Templates``, ``parse_date`` in ``_parse_date_header``; not
    ``ERR-4471`` in ``ERR-4471B``),
    case-insensitively, with any run of spaces, hyphens or underscores between its parts matching
    any other (``ZEBRA-4471`` = ``zebra 4471``, ``max_retry_ms`` = ``max-retry-ms``)."""
    parts = [re.escape(p) for p in re.split(r"[\s_\-]+", term.strip()) if p]
    if not parts:
        return False
    # Not preceded by a letter or digit; followed by no letter or digit, unless a CamelCase part
    # ("Templates" after "Jinja2") or "_" starts the next part of an identifier: "ERR-4471B" does
    # not hold "ERR-4471".
    pattern = r"(?<![^\W_])" + r"[\s_\-]*".join(parts) + r"(?:(?=(?-i:[A-Z][a-z])|_)|(?![^\W_]))"
    return re.search(pattern, text, re.I) is not None


# -- spelling variants and abbreviations --------------------------------------------------------

# Short forms writers use for a word, both ways: a question's "auth" is met by a page's
# "authentication", its "maximum" by "max". Only well-established abbreviations of software and
# office writing; an ambiguous one stands for each of its expansions.
ABBREVIATIONS: dict[str, tuple[str, ...]] = {
    "auth": ("authentication", "authorization"),
    "authn": ("authentication",),
    "authz": ("authorization",),
    "config": ("configuration",),
    "configs": ("configurations",),
    "max": ("maximum",),
    "min": ("minimum",),
    "info": ("information",),
    "repo": ("repository",),
    "repos": ("repositories",),
    "env": ("environment",),
    "envs": ("environments",),
    "prod": ("production",),
    "dev": ("development",),
    "db": ("database",),
    "dbs": ("databases",),
    "admin": ("administrator",),
    "admins": ("administrators",),
    "param": ("parameter",),
    "params": ("parameters",),
    "arg": ("argument",),
    "args": ("arguments",),
    "spec": ("specification",),
    "specs": ("specifications",),
    "stats": ("statistics",),
    "perf": ("performance",),
    "impl": ("implementation",),
    "dir": ("directory",),
    "dirs": ("directories",),
    "msg": ("message",),
    "msgs": ("messages",),
    "k8s": ("kubernetes",),
    "async": ("asynchronous",),
    "sync": ("synchronous",),
}
_EXPANSIONS: dict[str, tuple[str, ...]] = {}
for _short, _longs in ABBREVIATIONS.items():
    for _long in _longs:
        _EXPANSIONS[_long] = (*_EXPANSIONS.get(_long, ()), _short)
# British and American spellings (suffix, other suffix), each way: "behaviour"/"behavior",
# "normalise"/"normalize", "analyse"/"analyze", "centre"/"center", "catalogue"/"catalog",
# "cancelled"/"canceled".
_SPELLINGS = (
    ("our", "or"),
    ("ours", "ors"),
    ("ise", "ize"),
    ("ised", "ized"),
    ("ises", "izes"),
    ("ising", "izing"),
    ("isation", "ization"),
    ("yse", "yze"),
    ("ysed", "yzed"),
    ("tre", "ter"),
    ("tres", "ters"),
    ("ogue", "og"),
    ("ogues", "ogs"),
    ("elled", "eled"),
    ("elling", "eling"),
)


def word_variants(word: str) -> list[str]:
    """Other ways of writing the lower-case ``word``: its abbreviation or expansions
    (``ABBREVIATIONS``) and its British or American spelling (``_SPELLINGS``; for words of six
    letters or more, so "four" never becomes "for"). ``[]`` when there are none. A variant that
    is no word is harmless: it is only looked for in the evidence."""
    variants = list(ABBREVIATIONS.get(word, ()))
    variants += _EXPANSIONS.get(word, ())
    if len(word) >= 6:
        for a, b in _SPELLINGS:
            for end, other in ((a, b), (b, a)):
                if word.endswith(end) and len(word) - len(end) >= 3:
                    variants.append(word[: -len(end)] + other)
    return [v for v in dict.fromkeys(variants) if v != word]
