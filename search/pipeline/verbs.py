"""The act a "What did X *do* ...?" question asks about, and the forms a source writes it in.

A question asking for the object of a past act ("What did the electrician *find*?") is answered by
a record reporting that act; the gate holds its verb as the question's focus
(``search.pipeline.gate.missing_focus``), as the focus of who/what questions (Moldovan et al.,
ACL 2000, ``search.pipeline.answer_types.question_focus``).
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
