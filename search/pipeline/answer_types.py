"""Expected answer types: the form of value a question asks for, and whether a text holds one.

A question asking for a Slack channel, an email address, a link, a version, a count, a price or
a day cannot be answered from evidence holding no value of that form. This is the
expected-answer-type check of question-answering pipelines (Moldovan et al., "The structure and
performance of an open-domain question answering system", ACL 2000; money and dates are classes of
Li and Roth's question taxonomy, COLING 2002), kept to forms a pattern recognises without error.
The gate applies it to the evidence, the answer checks to an LLM's answer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from search.text import QUOTED, STOP_WORDS, without_citations
from sources.term_statistics import common_word


@dataclass(frozen=True)
class AnswerType:
    """A form of answer a question asks for: ``question`` recognises the asking ("which Slack
    channel"), ``answer`` a value of that form in text ("#incidents")."""

    label: str
    question: re.Pattern[str]
    answer: re.Pattern[str]
    verbatim: bool = True  # a value sources write as it is (a channel), not one an answer derives (a count)
    ignored: re.Pattern[str] | None = None  # text that looks like a value but is none (a date is no count)
    prefix: re.Pattern[str] | None = None  # a word a value may carry or not ("version 2.2.3" is "2.2.3")

    def core(self, value: str) -> str:
        """``value`` without its ``prefix`` ("version 2.2.3" -> "2.2.3"), or ``value`` itself."""
        return self.prefix.sub("", value) if self.prefix is not None else value

    def _readable(self, text: str) -> str:
        text = without_citations(text)
        return self.ignored.sub(" ", text) if self.ignored is not None else text

    def values(self, text: str) -> list[str]:
        """The values of this form in ``text``, in order, each once (citations ``[n]`` and the
        ``ignored`` spans do not count)."""
        return list(dict.fromkeys(m.group(0) for m in self.answer.finditer(self._readable(text))))

    def held_by(self, text: str) -> bool:
        """True when ``text`` holds a value of this form (citations ``[n]`` and the ``ignored``
        spans do not count)."""
        return bool(self.answer.search(self._readable(text)))


_NUMBER_WORDS = (
    "zero|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|fifteen|sixteen|"
    "seventeen|eighteen|nineteen|twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety|hundreds?|thousands?|"
    "millions?|billions?|dozens?|half|none|once|twice|thrice"
)
# Month names as dates write them: capitalised ("May 4", not "you may"), full or abbreviated.
_MONTHS = (
    "(?-i:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|Sep(?:t(?:ember)?)?|"
    "Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)"
)
# A point in time, written with digits: 2024-03-02, 2024-03-02T09:15:00Z, 09:15, 09:15:30, 03/02,
# 3/2/2024, "March 1", "June 2024", "1 March 2024", "Mar 1st, 2024", "since 2023", "Q1 2025", "FY24".
# A chat transcript stamps every line with one, so neither a count nor a version may be read from it.
_TIMESTAMP = re.compile(
    r"\b\d{4}-\d{2}-\d{2}(?:[T ]\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?\b"
    r"|\b\d{1,2}:\d{2}(?::\d{2})?(?:\s?[ap]\.?m\b\.?)?"
    r"|\b\d{1,2}/\d{1,2}(?:/\d{2,4})?\b"
    r"|\b(?:in|since|from|until|till|by|before|after|of)\s+(?:1[89]|20)\d\d\b"
    # a quarter, a half, a fiscal year: "Q1 2025", "Q3'25", "FY24"
    r"|\b(?-i:Q[1-4]|H[12]|FY)(?:\s?(?:1[89]|20)\d\d|['’]\d\d)\b|\b(?-i:FY)\d\d\b"
    rf"|\b{_MONTHS}\.?\s+(?:\d{{1,2}}(?:st|nd|rd|th)?\b(?:,?\s+\d{{4}}\b)?|\d{{4}}\b)"
    rf"|\b\d{{1,2}}(?:st|nd|rd|th)?\s+{_MONTHS}\b(?:,?\s+\d{{4}}\b)?",
    re.I,
)
# Capitalised words that number a part of something, not a release: "Step 3", "Page 2", "Room 101".
_NUMBERED_PARTS = (
    "Step|Page|Room|Section|Chapter|Table|Figure|Fig|Part|Phase|Item|Line|Level|Round|Day|Week|Month|Year|"
    "Issue|Ticket|Option|Rule|Tier|Stage|Question|Example|Appendix|Retry|Attempt|Floor|Building|Slide|Sprint|"
    "Q|No|Number|Top|Group|Team|Case|Task|Test|Point|Article|Clause|Note|Volume|Vol|Episode|Season"
)
# A list's enumerator ("details: 1) Customer viewed ...", "2. Restart" at a line's start): the
# item's place, not a count of anything. A number in parentheses, "(3)", may be a count.
_ENUMERATOR = r"(?m:^[ \t]*\d{1,2}\.(?=\s))|(?<![\w.,(])\d{1,2}\)(?=\s)"
# "One" as a pronoun, no count: "one of the fastest" (a partitive before a superlative), "no one",
# "one another" (Quirk et al. 1985, 6.55-6.57). "One of the three nodes failed" still counts one.
_PRONOUN_ONE = (
    r"\bone\s+of\s+(?:the|our|its|their|his|her|my|your)\s+(?:very\s+)?(?:most|least|best|worst|top|biggest|largest"
    r"|fastest|slowest|greatest|highest|lowest|oldest|newest|latest|earliest|simplest|easiest|hardest|strongest)\b"
    r"|\bno\s+one\b|\bone\s+another\b"
)
_NOT_A_COUNT = re.compile(rf"{_TIMESTAMP.pattern}|{_ENUMERATOR}|{_PRONOUN_ONE}", re.I)
# Money as sources write it: "$1,200", "€40", "USD 300", "1.2k EUR", "40 dollars", "free of charge".
_CURRENCY_CODES = "USD|EUR|GBP|CHF|CAD|AUD|JPY|INR|SEK|NOK|DKK"
# A number starts at a token's start, never after a digit, a dot or a comma (linear on "1,1,1,...").
_MONEY = re.compile(
    rf"[$€£¥]\s?\d|\b(?-i:{_CURRENCY_CODES})\s?\d|\d\s?[$€£¥]"
    rf"|(?<![\w.,])\d+(?:[.,]\d+)*(?:\s?(?:k|m|bn|million|billion|thousand))?"
    rf"\s?(?:{_CURRENCY_CODES}|(?:(?-i:US|U\.S\.|AU|CA|NZ|HK|SG)\s?)?dollars?|euros?|pounds?|cents?|bucks)\b"
    r"|\b(?:free\s+of\s+charge|at\s+no\s+(?:extra\s+)?(?:cost|charge)|no\s+charge|(?:is|are|was|were|it's)\s+free)\b",
    re.I,
)
# "What is the ...", "What's our ...", "Which were their ..." (the question word, a copula, a determiner)
_WHAT = r"\b(?:what|which)"
_COPULA = r"(?:\s+(?:is|was|are|were)|['’]s)"
_THE = r"\s+(?:the\s+|our\s+|their\s+|its\s+)?"
# A measure's unit after a number ("48h", "250ms", "2GB"): a duration or a size, not a count of things.
_MEASURE_UNITS = r"ms|s|m|h|d|w|kb|mb|gb|tb"
_MEASURE_NOUNS = frozenset(
    """second seconds minute minutes hour hours day days week weeks month months year years ms millisecond milliseconds
    microsecond microseconds nanosecond nanoseconds
    byte bytes kilobyte kilobytes megabyte megabytes gigabyte gigabytes terabyte terabytes kb mb gb tb""".split()
)


def _number_value(units: str) -> re.Pattern[str]:
    """A number standing on its own ("3", "1,200", "2.5", "40%", with one of ``units`` after it:
    "30s", "5GB"), not a digit of a name ("EC2", "OAuth2", "ZEBRA-4471"), or a number word."""
    return re.compile(
        rf"(?<![\w.\-/#])\d+(?:[.,]\d+)*(?![.,]\d)(?:%|(?:{units})\b)?(?![\w-])|\b(?:{_NUMBER_WORDS})\b", re.I
    )


ANSWER_TYPES = (
    AnswerType(
        "Slack channel",
        # "channel" alone may be a Go or Kafka channel: Slack must be named (within 300 characters)
        re.compile(
            r"\b(?:which|what)\s+slack\s+channels?\b|\b(?:which|what)\s+channels?\b(?=.{0,300}?\bslack\b)", re.I | re.S
        ),
        # "#billing-ops"; a colour ("#ff0000", "#fff") is none
        re.compile(
            r"(?<![\w#&/])#(?!(?=[0-9A-Fa-f]*\d)[0-9A-Fa-f]{3}(?:[0-9A-Fa-f]{3})?\b)[A-Za-z][A-Za-z0-9_-]*[A-Za-z0-9]"
        ),
    ),
    AnswerType(
        "email address",
        re.compile(r"\b(?:which|what)\s+e-?mail(?:\s+address(?:es)?)?\b", re.I),
        # starts only at a token start (linear); the domain ends in letters ("pkg@1.2.3" is a pin)
        re.compile(r"(?<![\w.+-])[\w.+-]+@[\w-]+(?:\.[\w-]+)*\.[A-Za-z][A-Za-z-]*\b(?!\.?\d)"),
    ),
    AnswerType(
        "phone number",
        re.compile(
            r"\b(?:which|what)\s+(?:(?:(?:tele)?phone|mobile|cell)(?:\s+numbers?)?|(?:pager|fax)\s+numbers?)\b", re.I
        ),
        # +1 (555) 010-4477, 030 1234 5678, 555-0100: seven digits or more in groups apart (a date,
        # a time or a range such as "11-05" is none)
        re.compile(r"(?<![\w.])(?=(?:\D{0,3}\d){7})\+?\(?\d{1,4}\)?(?:[ -]\(?\d{2,4}\)?){1,5}(?![\w.]?\d)"),
        ignored=_TIMESTAMP,
    ),
    AnswerType("link", re.compile(r"\b(?:which|what)\s+(?:url|link)s?\b", re.I), re.compile(r"https?://\S+")),
    AnswerType(
        "version",
        # "Which version ...", "What's the minimum pytest version ..."
        re.compile(rf"{_WHAT}{_COPULA}?\s+(?:the\s+)?(?:[\w-]+\s+){{0,2}}versions?\b", re.I),
        # 2.2.3, v2, 1.x, "version 3", "Python 3" (a capitalised name, then a number that is no date
        # and no numbered part: "Step 3" is none)
        re.compile(
            r"\b\d+(?:\.(?:\d+|x))+\b|\bv\d+(?:\.(?:\d+|x))*\b|\b(?:version|release)\s+\d+(?:\.(?:\d+|x))*"
            rf"|\b(?-i:(?!(?:{_NUMBERED_PARTS})\b)[A-Z][A-Za-z]+)[ \t]+\d+(?![\w/-]|\.[\dx])",
            re.I,
        ),
        # a link's or an address's digits are no release ("http://127.0.0.1:9999/api/v1", "10.0.0.12")
        ignored=re.compile(rf"{_TIMESTAMP.pattern}|https?://\S+|\b\d{{1,3}}(?:\.\d{{1,3}}){{3}}\b", re.I),
        prefix=re.compile(r"^(?:version|release|v)\s*", re.I),
    ),
    AnswerType(
        "amount of money",
        # "How much did each monitor cost?", "What is the referral bonus?": a price, not any count (not
        # "budget": an error or retry budget is no money)
        re.compile(
            # (not "how much time / memory / effort ... does it cost": a quantity of something else)
            r"\bhow\s+much\b(?!\s+(?:time|memory|ram|cpu|disk|space|storage|data|traffic|bandwidth|latency|overhead"
            r"|effort|work|load|capacity|quota|more|less|faster|slower|longer|of)\b)"
            r"(?=[^?.!]{0,80}?\b(?:cost|costs|costing|spend|spent|pay|paid|charge|charged"
            r"|price[ds]?|fees?|salary|salaries|bonus(?:es)?|reimburse[ds]?|refund(?:ed)?|invoiced?|billed)\b)"
            rf"|{_WHAT}{_COPULA}?{_THE}(?:[\w-]+\s+)?"
            r"(?:price|salary|salaries|fee|fees|per\s+diem|bonus|stipend|allowance)\b",
            re.I,
        ),
        _MONEY,
        verbatim=False,  # "$1,200" may be written "1200 USD" in the answer
    ),
    AnswerType(
        "calendar date",
        # "On what date ...", "Which day ...": a day, which a version or a year alone does not give
        re.compile(r"\b(?:what|which)\s+(?:date|day)(?![\w-])(?!\s*(?:range|format|field|column|picker)\b)", re.I),
        re.compile(
            r"\b\d{4}-\d{2}-\d{2}(?!\d)|\b\d{1,2}[/.]\d{1,2}[/.]\d{2,4}\b|\b\d{1,2}/\d{1,2}\b"
            rf"|\b{_MONTHS}\.?\s+\d{{1,2}}(?:st|nd|rd|th)?\b|\b\d{{1,2}}(?:st|nd|rd|th)?\s+(?:of\s+)?{_MONTHS}\b"
            r"|\b(?:mon|tues|wednes|thurs|fri|satur|sun)days?\b|\b(?:yesterday|today|tomorrow|tonight)\b",
            re.I,
        ),
        verbatim=False,  # "2024-03-02" may be written "March 2" in the answer
    ),
    AnswerType(
        "number",
        # a count, amount, share or duration ("how long", "what percentage", "the maximum number of")
        re.compile(
            # "how long" asks for a duration before a verb ("how long does it take", "how long ago"),
            # not inside a clause where "long" qualifies a noun ("changed how long prompts were handled")
            r"\bhow\s+(?:many|much)\b"
            r"|\bhow\s+long\b(?=\s*(?:\?|$|(?:do|does|did|is|are|was|were|will|would|can|could|should|must|has|have"
            r"|had|it|they|we|you|before|until|after|ago|to)\b))"
            r"|\bwhat\s+(?:percentage|proportion|fraction)\b"
            # a question naming the unit of its answer ("..., in requests per second?") asks for a quantity
            r"|(?:^|[,(])\s*in\s+(?:[\w-]+\s+){0,2}?(?:per\s+(?:second|minute|hour|day|week|month|request|user)"
            r"|(?:milli)?seconds|minutes|hours|days|weeks|months|years|ms|bytes|[kmgt]i?b|percent|dollars|euros)"
            r"(?=\s*(?:[,)?]|$))"
            r"|\bwhat\s+(?:is|was|are|were)\s+the\s+(?:\w+\s+)?(?:number|count|amount|percentage|price|cost)\s+of\b"
            # a quantity's name as the head of "what is the ...": a limit, a threshold, a timeout (the
            # numeric classes of Li and Roth's question taxonomy, COLING 2002), before a preposition,
            # a clause or the question's end ("What is the upload size limit for ...?", not "What
            # rate limiter ...")
            rf"|{_WHAT}{_COPULA}{_THE}"
            r"(?:[\w-]+\s+){0,2}?(?:max(?:imum)?|min(?:imum)?|limit|threshold|cap|ceiling|timeout|ttl|quota|capacity"
            r"|retention(?:\s+period)?|interval|frequency|size)"
            r"(?=\s+(?:of|for|in|on|per|at|that|when|before|after|we|they|it|set|used|applied)\b|\s+(?-i:[A-Z])|\s*[?,.;]|\s*$)"
            # or a maximum or minimum of anything ("What's the max retries per job?")
            rf"|{_WHAT}{_COPULA}{_THE}(?:[\w-]+\s+)?"
            r"(?:max(?:imum)?|min(?:imum)?)\b"
            # "at what size / rate / point ..." asks where a quantity switches ("At what file size does
            # it spill to disk?"); a port is a number ("Which port does staging listen on?")
            r"|\bat\s+(?:exactly\s+)?what\s+(?:[\w-]+\s+)?(?:size|length|rate|speed|threshold|level|count|number"
            r"|percentage|depth|age|temperature)\b"
            r"|\b(?:which|what)\s+(?:[\w-]+\s+){0,2}?(?:tcp\s+|udp\s+)?ports?\b(?!\s+(?:of|from)\b)",
            re.I,
        ),
        _number_value(f"k|x|{_MEASURE_UNITS}"),
        verbatim=False,  # "how many writeups …" is counted across sources, not copied from one
        ignored=_NOT_A_COUNT,
    ),
    AnswerType(
        "date",
        # "When was/did/will …" asks for a point in time ("when is X run?" asks for a condition)
        re.compile(r"^\W*when\s+(?:was|were|did|will)\b", re.I),
        # a year (not an amount: "2000 MB"), a date, a month or weekday, a time, a relative day, or
        # a release (software)
        re.compile(
            r"\b(?:1[89]|20)\d\d\b(?!\s?(?:[kmgt]i?b|ms|px|rpm|users|rows|requests)\b)|\b\d{1,2}/\d{1,2}\b|\b\d{1,2}:\d\d\b"
            rf"|\b{_MONTHS}\b|\b(?:mon|tues|wednes|thurs|fri|satur|sun)day\b|\b(?:yesterday|today|tomorrow|ago)\b"
            r"|\bv?\d+\.\d+(?:\.\d+)?\b",
            re.I,
        ),
        verbatim=False,  # a date an answer gives may be written otherwise in the source
    ),
)
# A count of things: a number or number word with no unit of time or size after it.
COUNT_OF_THINGS = AnswerType(
    "number",
    next(t for t in ANSWER_TYPES if t.label == "number").question,
    _number_value("k|x|(?-i:M|B|bn|mn)"),  # "12M users", "3B requests": a count in millions, billions
    verbatim=False,
    ignored=_NOT_A_COUNT,
)


def asked_answer_type(question: str) -> AnswerType | None:
    """The form of answer ``question`` asks for (``ANSWER_TYPES``, first match), or ``None``.

    "How many *instances* ...", whose counted focus (:func:`counted_focus`) is a thing and not a
    unit of time or size, asks for a count: a number with a unit ("48h", "250ms", "2GB") measures
    a duration or a size and answers no such question (``COUNT_OF_THINGS``)."""
    asked = next((t for t in ANSWER_TYPES if t.question.search(question)), None)
    if asked is not None and asked.label == "number":
        wh = _FOCUS_WH.search(QUOTED.sub(" , ", question))
        focus = counted_focus(question) if wh and re.fullmatch(r"how\s+many", wh.group(1), re.I) else None
        if focus is not None and focus.lower() not in _MEASURE_NOUNS:
            return COUNT_OF_THINGS
    return asked


def missing_type_note(label: str) -> str:
    """The sentence that opens an answer whose evidence holds no value of the asked form."""
    article = "an" if label[:1].lower() in "aeiou" else "a"
    return f"The sources found do not state {article} {label}, which the question asks for."


def ungrounded_values_note(values: list[str], label: str) -> str:
    """The sentence that opens an LLM answer giving values of the asked form its cited blocks lack."""
    listed = ", ".join(f"“{v}”" for v in values[:8])
    return f"The cited sources do not state {listed}, the {label} this answer gives: treat it as unverified."


def unstated_type_note(label: str) -> str:
    """The sentence that opens an LLM answer naming no value of the asked form."""
    return f"This answer does not state the {label} the question asks for: the sources found may not hold it."


# -- the question's focus --------------------------------------------------------------------------

# The question focus (Moldovan et al., ACL 2000, above): the word naming what a who/what/which/how
# many/how much question asks about ("Who *signed* the lease?", "What was the *budget* of the
# project?"). Evidence about the question's topic that never mentions its focus is about the topic,
# not the asked detail. Words that cannot be a focus looked for in the text:
AUXILIARIES = frozenset(
    # "s" and "re": "What's", "Who're" (the apostrophe is cut off with the question word)
    """is are was were be been being do does did done has have had will would can could should shall may might
    must s re""".split()
)
DETERMINERS = frozenset(
    """the a an each every our your my its their his her this that these those any some all both one two three four
    five six seven eight nine ten first last""".split()
)
# A preposition, conjunction or relative word ends the focus phrase ("the budget *of* the project").
FOCUS_ENDS = frozenset(
    """of for in on at to from with by about after before during when that which who whom whose where if so while than
    as into over under between through since until and or but per via""".split()
)
# Nouns a source does not write where it answers: a light noun ("the way", "the process"), the name
# of a value's form (a date, a number, a name: the answer is the value itself), a kind of
# document (the answer is the document: a commit never calls itself "the change"), a pronoun.
_LIGHT_NOUNS = frozenset(
    """function functions class classes method methods module modules file files thing things way ways kind kinds type
    types one ones part parts process procedure steps step approach option options setting settings""".split()
)
_VALUE_NOUNS = frozenset(
    """time times date dates day days deadline year years month months hour hours minute minutes second seconds share
    percentage percent proportion fraction number numbers amount amounts count value values version versions name names
    size limit port price cost""".split()
)
_DOCUMENT_NOUNS = frozenset(
    """pr prs pull request requests commit commits change changes fix fixes ticket tickets issue issues page pages doc
    docs document documents thread threads channel channels writeup writeups report reports postmortem postmortems
    review reviews discussion chat message messages email emails meeting meetings""".split()
)
_PRONOUNS = frozenset("i we you they he she it people someone anyone everyone folks".split())
# Determiners that open a verb's object ("Which service calls *the* client"): not a numeral of the
# phrase itself ("one", "first", "last"), nor "that", which after a noun is a relative word.
_OBJECT_DETERMINERS = DETERMINERS - {"one", "first", "last"} - FOCUS_ENDS
_NOT_FOCUS = _LIGHT_NOUNS | _VALUE_NOUNS | _DOCUMENT_NOUNS | _PRONOUNS
_FOCUS_WH = re.compile(r"\b(who|whom|what|which|how\s+many|how\s+much)\b", re.I)
_FOCUS_WORD = re.compile(r"[\w'’\-/.]+")
FOCUS_WORDS = 2  # of the phrase after the question word, its head is the last of at most this many words
COUNTED_WORDS = 4  # after "how many", the counted plural is looked for among this many words
_MODALS = frozenset("can could will would should shall may might must".split())
_DO_SUPPORT = frozenset("do does did".split())
# A verb right after "what" makes "what" its subject ("What *happened* to p99", "What *went* wrong"):
# a past tense (one of the common irregular ones, or a regular one before a preposition or the
# question's end: "What *embedded* database" is an adjective) or a form of "happen".
_IRREGULAR_PAST = frozenset(
    "went broke made took came ran got led told said became left brought began fell gone broken done taken".split()
)
_HAPPEN = frozenset("happen happens happened".split())
# After an auxiliary, a past participle the regular pattern misses ("What was *sent* to the vendor?").
_IRREGULAR_PARTICIPLES = frozenset(
    """cut set put hit shut split lost found sent built kept held shown seen given written chosen known spent paid
    sold""".split()
)
# "get" as the passive's auxiliary ("What *got* merged", "What is *getting* renamed").
_PASSIVE_GET = frozenset("get gets getting got gotten".split())
# Adverbs that stand between the question word and its verb ("What *really* changed ...?", "Who
# *originally* wrote ...?"): no part of the phrase.
ADVERBS = frozenset(
    """actually really exactly finally ever just originally eventually ultimately initially basically specifically
    officially currently usually typically recently precisely roughly approximately still already even also then
    now once twice again""".split()
)
# After "who", a linking verb names no act ("Who *remains* owner ...": a role, as "Who is the owner").
_LINKING_VERBS = frozenset("become becomes became remain remains remained stay stays stayed".split())
# A verb and "to be" (or "being") that link like "is" ("What *turned out to be* the cause?", "Who
# *ended up being* the owner?"; catenative verbs, Huddleston and Pullum, The Cambridge Grammar of
# the English Language, 2002, ch. 14).
_CATENATIVE_LINK = re.compile(
    r"(?:turn(?:s|ed)? out|prove[sd]?|proven|seem(?:s|ed)?|appear(?:s|ed)?|happen(?:s|ed)?) to be\b"
    r"|end(?:s|ed)? up (?:being|as)\b"
)
_REGULAR_PAST = re.compile(r"[a-z]{2,}[^e]ed")
FORMAT_CHARACTERS = re.compile(r"[\u00ad\u200b-\u200f\u202a-\u202e\u2060-\u2064\ufeff]")  # invisible
WORD_SHAPE = re.compile(r"[^\W\d_][\w'’-]{1,39}")  # a word: a letter first, 2 to 40 characters


# Adverbs that follow a verb, not a noun's modifier: "What *changed* recently ...".
VERB_ADVERBS = ADVERBS | frozenset("yesterday today tonight lately overnight since".split())


def _is_verb(word: str, after: str) -> bool:
    """Whether ``word``, after "what" (and its auxiliaries), is a verb: a form of "happen", a
    common irregular past, or a regular past before a preposition, an adverb (``VERB_ADVERBS``),
    a comma or the question's end ("What *changed* in ...", "What *changed* recently ...", not
    "What *embedded* database ...")."""
    if word in _HAPPEN or word in _IRREGULAR_PAST:
        return True
    return bool(_REGULAR_PAST.fullmatch(word)) and (after in FOCUS_ENDS or after in VERB_ADVERBS or after == ",")


def question_focus(question: str) -> str | None:
    """The focus of a who/what/which/how-many/how-much ``question``: one word, lower-cased, or ``None``.

    After "who" (or "who" and a modal: "Who can *approve* ...") comes a verb ("Who *approved* the
    refund?") unless an auxiliary follows ("Who was the release *manager*?"); otherwise the focus is
    the head (last word) of the phrase after the question word, its auxiliaries and determiners, cut
    at a preposition, a conjunction or a relative word and at ``FOCUS_WORDS`` words ("What was the
    *budget* of the project?", "How many *replicas* does staging run?"). Quoted spans are no part
    of it (a quoted value is looked for as written, ``search.pipeline.gate.named_terms``).
    ``None`` when the question has no such phrase; when "do" follows the question word ("What does
    X return?": the phrase is a subject and its verb, the asked thing unnamed) or a verb does ("What
    caused the outage?", "What happened to ...", "What went wrong"); or when its head cannot be a
    focus looked for in text (``_NOT_FOCUS``: "What *time* ...", "Which Slack *channel* ...",
    "Which *pull request* ...", "Which *function* ...": the answer is a value, a document or a code
    object, described in other words). A question asking who knows a topic keeps its verb here
    ("Who *knows* ..."); the gate sets it aside once people are credited for it
    (``search.pipeline.gate.credits_people``)."""
    text = QUOTED.sub(" , ", FORMAT_CHARACTERS.sub("", question))  # a quoted span ends the phrase
    match = _FOCUS_WH.search(text)
    if match is None:
        return None
    words = [re.sub(r"['’]s$", "", w.strip(".,?!:;'\"’").lower()) for w in _FOCUS_WORD.findall(text[match.end() :])]
    words = [w if WORD_SHAPE.fullmatch(w) or w in ("s", "re") else "," for w in words if w]
    catenative = _CATENATIVE_LINK.match(" ".join(words[:5]))
    if catenative:  # "What *turned out to be* the cause": as "What was the cause"
        words = ["was", *words[len(catenative.group(0).split()) :]]
    lead = 0  # the auxiliaries and adverbs right after the question word: adverbs dropped
    while lead < len(words) and (words[lead] in AUXILIARIES or words[lead] in ADVERBS):
        if words[lead] in ADVERBS:
            del words[lead]
        else:
            lead += 1
    if not words or words[0] in _LIGHT_NOUNS or words[0] in _DOCUMENT_NOUNS or words[0] in _DO_SUPPORT:
        return None
    if match.group(1).lower() in ("who", "whom"):
        rest = words[1:] if words[0] in _MODALS or words[0] == "else" else words
        if rest and rest[0] in _LINKING_VERBS:
            words = ["is", *rest[1:]]  # "Who stays *owner* of ...": as "Who is ..."
        elif rest and rest[0] not in AUXILIARIES and rest[0] not in FOCUS_ENDS and rest[0] != ",":
            return rest[0] if rest[0] not in _NOT_FOCUS else None
    if words[0] not in AUXILIARIES and words[0] not in DETERMINERS and words[1:2] and words[1] in DETERMINERS:
        return None  # "What *caused* the outage?": "what" is the subject of a verb, the asked thing unnamed
    k = 0  # past "has", "was", "'s": "What has *changed*", "What was *deployed* on Friday?"
    while k < len(words) - 1 and (words[k] in AUXILIARIES or words[k] in _PASSIVE_GET):
        k += 1
    after = words[k + 1] if k + 1 < len(words) else ","
    if match.group(1).lower() == "what" and (
        _is_verb(words[k], after) or (k > 0 and words[k] in _IRREGULAR_PARTICIPLES)
    ):
        return None  # "What *happened* to p99 ...?", "What *changed* in 0.140?": the same
    i = 0
    while i < len(words) and (words[i] in AUXILIARIES or words[i] in DETERMINERS):
        i += 1
    if match.group(1).lower().startswith("how") and match.group(1).lower().endswith("many"):
        # "How many" counts a plural noun: the first plural of the phrase (up to ``COUNTED_WORDS``
        # words) is its head, not a verb after it ("How many *engineers* work on billing?", "How
        # many extra *GPUs* did we add?", "How many internal incident *writeups* ...").
        for word in words[i : i + COUNTED_WORDS]:
            if word in FOCUS_ENDS or word in AUXILIARIES or word == ",":
                break
            if word in _PRONOUNS or (len(word) > 3 and word.endswith("s") and not word.endswith("ss")):
                return word if word not in _NOT_FOCUS else None
    phrase: list[str] = []
    while i < len(words) and len(phrase) < FOCUS_WORDS:
        word = words[i]
        if word in FOCUS_ENDS or word == "," or (phrase and word in AUXILIARIES):
            break
        if phrase and i + 1 < len(words) and words[i + 1] in _OBJECT_DETERMINERS:
            break  # "Which service *calls* the ...", "What tool *builds* the ...": a verb and its object
        if word not in DETERMINERS and word not in AUXILIARIES:
            phrase.append(word)
        i += 1
    # A head that names the answer's form ("Which Slack *channel*", "What release *date*") leaves no focus.
    return phrase[-1] if phrase and phrase[-1] not in _NOT_FOCUS else None


_DO_QUESTION = re.compile(r"^\W*(?:did|does|do)\b", re.I)


def yes_no_focus(question: str) -> str | None:
    """The object a do-support yes/no ``question`` asks about ("Did Dana get an *offer* after the
    interview?", "Does the proxy strip the *prefix*?"): the head (last word) of the noun phrase
    after the last determiner of its first clause (cut at a preposition, a conjunction or a comma;
    an apposition between commas and a parenthesis are dropped), provided that determiner is not
    the clause's first word (that one opens the subject: "Does the official extension work in
    ..." asks about no object). ``None`` for other questions or when no such phrase is found: the
    rule then asks nothing. A source that answers yes or no names what was got, done or supported;
    one that never mentions the object is about something else (Moldovan et al., ACL 2000, take
    the object noun as the focus of such questions)."""
    text = QUOTED.sub(" x ", FORMAT_CHARACTERS.sub("", question))
    opening = _DO_QUESTION.match(text)
    if opening is None:
        return None
    rest = re.sub(r"\([^()]*\)", " ", re.sub(r",[^,?]*,", " ", text[opening.end() :]))
    words: list[str] = []
    for raw in re.split(r"\s+", re.split(r"[,;?!—]| - ", rest)[0].strip()):
        word = re.sub(r"['’]s$", "", raw.strip(".:'\"’").lower())
        if word in FOCUS_ENDS:
            break
        words.append(word)
    openers = [i for i, w in enumerate(words) if i > 0 and w in _OBJECT_DETERMINERS]
    if not openers:
        return None
    phrase = [w for w in words[openers[-1] + 1 :] if w not in DETERMINERS and w not in ADVERBS]
    head = phrase[-1] if phrase else None
    return head if head and head not in _NOT_FOCUS and WORD_SHAPE.fullmatch(head) else None


def counted_focus(question: str) -> str | None:
    """What a "how many/how much" ``question`` counts, when a source would state the count: its
    focus (:func:`question_focus`) when its first question word is "how many" or "how much", else
    ``None``. A counted document ("How many incident *writeups* describe ...") is no focus
    (``_NOT_FOCUS``): such a count is made across sources, not one a source states."""
    match = _FOCUS_WH.search(QUOTED.sub(" , ", FORMAT_CHARACTERS.sub("", question)))
    if match is None or not match.group(1).lower().startswith("how"):
        return None
    return question_focus(question)


# Nouns naming a person, a group or an organization: "Which *customer* ...", "What *team* ...". The
# answer to such a question, as to a who-question, is a name (the PERSON / ORGANIZATION answer types
# of QA systems: Moldovan et al., ACL 2000).
_PARTY_NOUNS = frozenset(
    """customer customers client clients candidate candidates applicant applicants vendor vendors supplier suppliers
    partner partners company companies team teams person engineer engineers manager managers owner owners lead leads
    employee employees contractor contractors member members author authors reviewer reviewers maintainer maintainers
    contributor contributors organization organizations org orgs hire hires provider providers""".split()
)


def party_focus(question: str) -> str | None:
    """The focus (:func:`question_focus`) of a ``question`` whose answer names a person, team or
    organization by a noun: a who/whom question's role ("Who was the release *manager*?", "Who
    remains *owner* ..."), or one of ``_PARTY_NOUNS`` after which/what ("Which *customer* ...").
    Else ``None``; also for a who-question's verb ("Who *volunteered* ..."), which a reply answers
    in its own words ("I can captain")."""
    focus = question_focus(question)
    text = QUOTED.sub(" , ", FORMAT_CHARACTERS.sub("", question))
    match = _FOCUS_WH.search(text)
    if match is None:
        return None
    if match.group(1).lower().startswith("how"):
        return None  # "How many customers ...": a count, not a name
    before = text[: match.start()].rstrip()
    if before and before[-1] not in ".!?:;,—-(\n":
        return None  # a relative "who" ("notify customers *who* were affected"): not what is asked
    following = [w.lower().lstrip("'’") for w in re.findall(r"[\w'’-]+", text[match.end() :])[:4]]
    if following[:1] == ["of"]:  # "Which of our customers ...": as "Which customers"
        following = [w for w in following[1:] if w not in DETERMINERS]
    following = following[:2]
    if match.group(1).lower() in ("who", "whom"):
        verb = following[0] if following else ""
        return focus if verb in AUXILIARIES or verb in _LINKING_VERBS else None
    if focus in _PARTY_NOUNS:
        return focus
    # "Which customer *asked* for ...": the noun right after which/what (or after one modifier,
    # "Which enterprise customer ...") is the focus, whatever verb the phrase ends in.
    for word in following:
        if word in AUXILIARIES or word in DETERMINERS:
            break
        if word in _PARTY_NOUNS:
            return word
    return None


_NAME_TOKEN = re.compile(r"[^\W\d_][\w'’-]*")  # a Unicode word: "Björn", "O'Neil", "InfraAnalytics"
_AT_HANDLE = re.compile(r"(?<![\w.])@[^\W\d_][\w.-]*")  # @dana
_EMAIL = re.compile(r"(?<![\w.+-])[\w.+-]+@[\w-]+\.[\w.]+")  # dana@example.com (one start per run: linear)
_CALENDAR_WORDS = frozenset(
    """monday tuesday wednesday thursday friday saturday sunday january february march april may june july
    august september october november december jan feb mar apr jun jul aug sep sept oct nov dec""".split()
)
_SENTENCE_OPENERS = ".!?:;\n\"'“(*-•"


def _capitalized(word: str) -> bool:
    """A capitalized word, not an acronym or a code ("Dana", "Björn", "InfraAnalytics"; not "API",
    "SRE", "H100s")."""
    if not word[0].isupper():
        return False
    parts = [part for part in re.split(r"[-‐]", word) if part]
    return (
        all(part[0].isupper() for part in parts)  # "Mary-Jane", not "Dedicated-to-Hosted"
        and not word.isupper()
        and not any(c.isdigit() for c in word)
    )


def names_someone(text: str, question: str, focus: str = "") -> bool:
    """Whether ``text`` (a sentence) writes a name of a person, team or organization the
    ``question`` does not: an @handle or an email address; a run of two or more capitalized words
    ("Dana Whitfield", "Eng Platform", "the Platform *Team*": a run ending in the ``focus`` names
    one of what is asked for, one starting with it, "Customer Success", names something else); a
    capitalized word that is no common English word ("Initech", "Björn";
    ``sources.term_statistics.common_word``); a capitalized common word ("Mark", "Apple") where a
    verb or a preposition follows it ("Mark *is* the owner", "asked Sarah *about* it") or, inside
    a sentence, punctuation ("the owner is Mark."), not where a noun does ("a Hosted *pool*",
    "Covered *customers*": a product tier, an adjective). Not counted: words the
    question holds (any case: the asker named them); a word or run before a colon (a chat
    message's speaker, a record's field name: "Priya Raman: ...", "Mitigation: ..."); a weekday or
    month ("by Friday"); an acronym ("API", "SRE": tech writing is full of them). A name is told
    from a product or a tool only by where it stands, so "the Zendesk integration" names someone
    too: the rule catches sentences that name no one at all."""
    if _AT_HANDLE.search(text) or _EMAIL.search(text):
        return True
    asked = {w.lower() for w in _NAME_TOKEN.findall(question)}
    tokens = list(_NAME_TOKEN.finditer(text))
    i = 0
    while i < len(tokens):
        if not _capitalized(tokens[i].group(0)):
            i += 1
            continue
        j = i  # the run of capitalized words, apart by spaces only
        while j + 1 < len(tokens) and _capitalized(tokens[j + 1].group(0)):
            if text[tokens[j].end() : tokens[j + 1].start()].strip(" \t"):
                break
            j += 1
        run, i = tokens[i : j + 1], j + 1
        while len(run) > 1 and (run[0].group(0).lower() in STOP_WORDS or run[0].group(0).lower() in _PRONOUNS):
            run = run[1:]  # "The Dedicated tier": the article opens the sentence, it names nothing
        words = [t.group(0).lower() for t in run]
        if text[run[-1].end() : run[-1].end() + 1] == ":" or all(w in asked or w in _CALENDAR_WORDS for w in words):
            continue
        if len(run) > 1:
            if focus not in words or words[-1] == focus:
                return True
            continue
        if not all(common_word(part) for part in re.split(r"[-‐]", words[0]) if part):
            return True  # "Initech", "Björn"
        # A common word capitalized ("Mark", "Apple", or the tier "Hosted"): a name where a verb, a
        # preposition or, inside a sentence, punctuation follows ("Mark *is*", "asked Sarah *about*",
        # "owner is Mark*.*"), not where a noun does ("a Hosted *pool*": a modifier).
        before = text[: run[0].start()].rstrip()
        opens = not before or before[-1] in _SENTENCE_OPENERS
        if opens and (words[0] in STOP_WORDS or words[0] in _PRONOUNS):
            continue  # "We shipped ...", "The ..."
        after = text[run[0].end() :]
        following = re.match(r"\s*([a-z]+)\b", after)
        if following:
            word = following.group(1)
            if word in AUXILIARIES or word in _LINKING_VERBS or word in FOCUS_ENDS or word.endswith("ed"):
                return True
        elif not opens and re.match(r"(?:['’]s\b|\s*(?:[.,;!?]|$))", after):
            return True
    return False


# Nouns naming the kind of thing an answer is, that a source never calls itself: a code object, a
# document. Not the document nouns that are as often verbs after "what" ("What *changes* the
# status", "What *issues* refunds", "What *fixes* ..."), nor "request" unless a pull request.
_FORM_NOUNS = frozenset(
    """function functions class classes method methods module modules file files decorator decorators pr prs commit
    commits ticket tickets doc docs document documents thread threads postmortem postmortems writeup writeups""".split()
)


def _after_which_or_what(question: str) -> list[str]:
    """The (at most two) words after the first "which" or "what" of ``question``, lower-cased."""
    match = re.search(r"\b(?:which|what)\s+((?:[\w-]+\s+){0,1}[\w-]+)", question, re.I)
    return [w.lower() for w in match.group(1).split()] if match else []


def answer_form_words(question: str) -> list[str]:
    """The words right after "which" or "what" (at most two) that name the kind of thing the
    answer is, a code object or a document ("Which *function* builds ...", "What *pull request*
    added ..."): the answer is that thing, which does not call itself so (a definition never
    writes "function", a commit not "pull request"). Lower-cased, in order."""
    words = _after_which_or_what(question)
    if words[:1] == ["pull"] and words[1:2] in (["request"], ["requests"]):
        return words
    return [w for w in words if w in _FORM_NOUNS]


def asks_for_document(question: str) -> bool:
    """Whether ``question`` asks which document did something ("Which pull request added ...",
    "What recent change fixed ..."): a document noun (``_DOCUMENT_NOUNS``) in the two words after
    "which" or "what"."""
    return any(w in _DOCUMENT_NOUNS for w in _after_which_or_what(question))


def missing_focus_note(word: str, *, partial: bool = True) -> str:
    """The sentence that opens an answer whose answering passages never mention the question's
    focus (``partial``), or follows a decline."""
    said = f"The sources found do not mention “{word}”, which the question asks about"
    return said + (", so they answer this only in part." if partial else ".")
