"""The act a "What did X *do* ...?" or "When was X *done*?" question asks about, and the forms a
source writes it in.

A question asking for the object of a past act ("What did the electrician *find*?") or for the
time of an event ("When was the hotfix *rolled out*?") is answered by a record reporting that act;
the gate holds its verb as the question's focus (``search.pipeline.gate.missing_focus``), as the
focus of who/what questions (Moldovan et al., ACL 2000,
``search.pipeline.answer_types.question_focus``).
"""

from __future__ import annotations

import re

from search.pipeline.answer_types import (
    ADVERBS,
    DETERMINERS,
    FOCUS_ENDS,
    FORMAT_CHARACTERS,
    VERB_ADVERBS,
    WORD_SHAPE,
)
from search.text import QUOTED

# Verbs a source does not write where it answers what someone did with them: reporting and
# light verbs ("What did Maya *say* ...", "What does the page *recommend* ...", "What does it
# *return*") and verbs of deciding ("What did we *decide* ...": "we chose PostgreSQL 16", "going
# with the blue one"), answered by the statement or the decision itself.
_LIGHT_VERBS = frozenset(
    """do say mean use need want get have make take look think go come see know like include contain show tell call
    cover describe mention specify list state explain write recommend suggest propose return yield give end happen
    expect consider change cause involve require support accept allow expose provide offer send
    decide settle agree conclude determine choose pick select opt prefer""".split()
)
_PARTICLES = frozenset("up out off down back over away".split())
_TIME_WORDS = frozenset("first last later earlier next again instead afterwards tomorrow".split())
# Past forms of common verbs, which the stemmer does not bring to the verb ("found" is not "find").
IRREGULAR_FORMS = {  # "choose": "chose chosen"
    verb: forms.replace(",", " ")
    for verb, forms in (
        entry.split(":")
        for entry in """find:found buy:bought pay:paid choose:chose,chosen break:broke,broken run:ran bring:brought
    catch:caught sell:sold build:built win:won lose:lost spend:spent hold:held leave:left meet:met feel:felt hear:heard
    keep:kept teach:taught fight:fought seek:sought drive:drove,driven ride:rode,ridden eat:ate,eaten fall:fell,fallen
    grow:grew,grown throw:threw,thrown draw:drew,drawn begin:began,begun sing:sang,sung steal:stole,stolen
    forget:forgot,forgotten freeze:froze,frozen lead:led bite:bit,bitten hide:hid,hidden shake:shook,shaken
    wake:woke,woken swear:swore,sworn tear:tore,torn wear:wore,worn sink:sank,sunk spin:spun withdraw:withdrew,withdrawn
    undo:undid,undone rebuild:rebuilt overwrite:overwrote,overwritten stand:stood rerun:reran shoot:shot
    dig:dug light:lit feed:fed bend:bent lend:lent send:sent strike:struck stick:stuck sweep:swept""".split()
    )
}


_BASE_FORMS = {form: verb for verb, forms in IRREGULAR_FORMS.items() for form in forms.split()}
# Verbs of aspect: the start, end or course of an event, whose time a source states in any words
# ("from 09:14", "until noon", "went live on 3/4"), not with the verb.
_ASPECT_VERBS = frozenset("start starts started begin begins began begun finish finished stop stopped occur".split())
_PREPOSITIONS = frozenset(
    """to in on at for from by with into onto across over under after before during via through against about as than
    since until within without""".split()
)


def with_past_forms(word: str) -> str:
    """``word`` followed by its irregular past forms, if any ("find" -> "find found"): the text whose
    lexemes a source reporting the act may hold."""
    return f"{word} {IRREGULAR_FORMS.get(word.lower(), '')}".rstrip()


def _drop_trailing_modifiers(clause: list[str]) -> None:
    """Pop, from the end of ``clause``, particles ("spin *up*"), adverbs of manner or time ("fix
    *manually*", "find *yesterday*", "flag *first*"): what may follow the verb of a "what did"
    question before its first preposition."""
    while len(clause) > 1:
        word = clause[-1].lower()
        if word in _PARTICLES or word in VERB_ADVERBS or word in _TIME_WORDS or (len(word) > 4 and word.endswith("ly")):
            clause.pop()
        else:
            break


def object_question_verb(question: str) -> str | None:
    """The verb of a question asking what someone did ("What did the electrician *find* when
    ...?", "What did the vendor *ship* ..."): a record answering it reports that act, in the verb's
    own forms or its noun ("found", "findings"); a ticket about the inspection that never says
    what was found is a near miss. Only "did": a past act is recorded with its verb, while "What
    does X *verb*" asks how something behaves, which a page describes in other words (on the
    unseen FastAPI questions the rule read "does" too and declined an answerable question).
    ``None`` for other questions, for a light or reporting verb (``_LIGHT_VERBS``: "What did Maya
    *say*", "What did the team *recommend*": the statement itself is the answer), and when the
    verb is not found.

    After "what/which did" come the subject and the verb, up to the first comma,
    question mark, preposition (not "of": "the audit *of* our service *conclude*"), conjunction or
    relative word ("... *find* when they inspected ..."): the verb is the last word before it,
    past a particle ("send *over*") and before an "-ing" complement ("recommend *checking*"). It
    is lower case and follows no determiner; a capitalized word (a name) is never the verb."""
    text = QUOTED.sub(" x ", FORMAT_CHARACTERS.sub("", question))
    match = re.search(r"(?:^|[.;:!?—])\W{0,8}(?:what|which)\s+did\s+(.*)", text, re.I | re.S)
    if match is None:
        return None
    words = [w.strip(".'’") for w in re.findall(r"[\w'’\-/.#]+|[,?;!]", match.group(1))]
    clause: list[str] = []
    for word in words:
        if word in ",?;!" or (word.lower() in FOCUS_ENDS and word.lower() != "of"):
            break
        clause.append(word)
    _drop_trailing_modifiers(clause)
    if len(clause) > 2 and clause[-1].lower().endswith("ing") and clause[-2][:1].islower():
        clause.pop()  # "recommend *checking*", "end up *choosing*": the complement of the verb before it
        _drop_trailing_modifiers(clause)
    if len(clause) < 2 or not clause[-1][:1].islower() or clause[-2].lower() in DETERMINERS:
        return None
    verb = clause[-1].lower()
    if not WORD_SHAPE.fullmatch(verb) or verb in _LIGHT_VERBS or verb in ADVERBS:
        return None
    return verb


_WHEN_DO = re.compile(
    r"(?:^|[.;:!?—])\W{0,8}(?:when|(?:on\s+)?what\s+(?:date|day))\s+(?:did|does|do|will)\s+(.*)", re.I | re.S
)
_WAS_DONE = re.compile(
    r"(?:^|[.;:!?—])\W{0,8}(?:when|(?:on\s+)?what\s+(?:date|day))\s+(?:was|were|has\s+been|have\s+been|had\s+been|got|will\s+be)\s+(.*)",
    re.I | re.S,
)
_REGULAR_PARTICIPLE = re.compile(r"[a-z]{3,}ed")
_OBJECT_PRONOUNS = frozenset("it them him her us me you this that these those".split())
_CLAUSE_WORDS = frozenset("whether because once unless how why what".split())  # a clause after the verb


def _words(text: str) -> list[str]:
    return [w.strip(".'’") for w in re.findall(r"[\w'’\-/.#]+|[,?;!—]", text)]


def event_verb(question: str) -> str | None:
    """The verb of a question asking when an event took place ("When did Acme *renew* ...?",
    "On what date was the hotfix *rolled out* ...?", "When does the exception *expire*?"), in its
    base form for an irregular verb ("built" -> "build"): a record answering it states the event
    with its time; a ticket about the hotfix that never says it was rolled out is a near miss.
    ``None`` for other questions, for a light, reporting or deciding verb (``_LIGHT_VERBS``) or a
    verb of aspect ("When did the outage *start*": ``_ASPECT_VERBS``, whose time is written in
    any words), and when the verb is not found.

    After "when did/does/will": the subject and the verb, up to the first comma, question mark,
    preposition, conjunction or relative word; the verb is the last word before it, past a
    particle or an adverb, lower case and after no determiner. After "when was/were/has been":
    the subject, then a past participle (a regular "-ed" form or an irregular one,
    ``IRREGULAR_FORMS``) that ends the clause or comes before a particle or a preposition ("the
    hotfix *rolled* out to ...": not "the *failed* deploy", an adjective before its noun)."""
    text = QUOTED.sub(" x ", FORMAT_CHARACTERS.sub("", question))
    match = _WHEN_DO.search(text)
    if match is not None:
        clause: list[str] = []
        for word in _words(match.group(1)):
            if word in ",?;!—" or word.lower() in FOCUS_ENDS | _CLAUSE_WORDS or word.lower() in _PREPOSITIONS:
                break
            clause.append(word)
        # The verb's object, if any, opens with a determiner or a pronoun ("renew *its* contract",
        # "ship *it*"): the verb is the word before it; else the clause's last word ("expire").
        starts = [i for i in range(2, len(clause)) if clause[i].lower() in DETERMINERS | _OBJECT_PRONOUNS]
        if starts:
            del clause[starts[0] :]
        _drop_trailing_modifiers(clause)
        if len(clause) < 2 or not clause[-1][:1].islower() or clause[-2].lower() in DETERMINERS:
            return None
        verb = clause[-1].lower()
    else:
        match = _WAS_DONE.search(text)
        if match is None:
            return None
        words = _words(match.group(1))
        verb = ""
        for i, word in enumerate(words[1:], start=1):
            if word in ",?;!—":
                break
            after = words[i + 1].lower() if i + 1 < len(words) else "?"
            participle = word[:1].islower() and (_REGULAR_PARTICIPLE.fullmatch(word) or word in _BASE_FORMS)
            if participle and (after in ",?;!—" or after in _PARTICLES or after in _PREPOSITIONS):
                verb = word.lower()
                break
        if not verb:
            return None
    verb = _BASE_FORMS.get(verb, verb)
    if not WORD_SHAPE.fullmatch(verb) or verb in _LIGHT_VERBS or verb in _ASPECT_VERBS or verb in ADVERBS:
        return None
    return verb
