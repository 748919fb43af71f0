"""Expected answer types over real-world text, and chat transcripts cut into messages.

A value of the asked form is found however sources usually write it, and text that only looks
like one (a date, a name's digit, a step number, a colour) is none; a transcript's messages are
passages the gate and the extractive answer can use, nothing of them lost or changed.
"""

from __future__ import annotations

import time

import pytest

from search.pipeline.answer_types import ANSWER_TYPES, asked_answer_type
from search.pipeline.checks import ungrounded_values
from search.pipeline.passages import block_passages
from sources.selectors import scope_for_user
from tests.search.conftest import scored_verdict
from tests.search.test_gate import _block

TYPES = {t.label: t for t in ANSWER_TYPES}
# Not a speed target (bench/ holds those): a pattern that backtracks quadratically takes tens of
# seconds on 100 KB, a linear one well under a second even on a loaded machine.
SUPERLINEAR_SECONDS = 5.0


# -- answer types: values of the asked form that are none, and real values missed ----------------


@pytest.mark.parametrize(
    "text",
    [
        "Up to 10 may be queued at once.",  # the modal "may" read as a month: "10 may" is a date
        "At most 3 may run in parallel",
        "Retries: thirty, then the job is parked.",  # number words beyond twelve are missing
        "The queue holds twenty jobs.",
        "Zero retries are attempted.",
        "It retries twice before paging.",
    ],
)
def test_a_real_count_is_not_missed(text):
    assert TYPES["number"].held_by(text), text


@pytest.mark.parametrize(
    "text",
    [
        "The billing service runs on EC2 behind an S3 bucket.",  # digits inside names
        "We log in with OAuth2.",
        "The export no longer runs nightly.",  # the word "no"
        "2024-03-02 09:15 Ana: the export broke again on 03/02",  # a date the stamp pattern misses
        "2024-03-02 09:15 Ana: it has been broken since 2023",  # a year
    ],
)
def test_a_digit_that_is_no_count_is_not_a_count(text):
    assert not TYPES["number"].held_by(text), TYPES["number"].values(text)


@pytest.mark.parametrize(
    "text",
    ["See Step 3 of the guide.", "Room 101 is on the first floor.", "Page 2 explains the proxy.", "Retry 3 times."],
)
def test_a_capitalised_word_and_a_number_is_no_version(text):
    assert not TYPES["version"].held_by(text), TYPES["version"].values(text)


@pytest.mark.parametrize(
    "text", ["The portal requires PostgreSQL 16.", "The workers run Java 17.", "Use Python 3, not 2.", "Node 20!"]
)
def test_a_named_version_at_a_sentence_end_is_a_version(text):
    """A source sentence ends with a full stop (no citation follows it, unlike an answer's)."""
    assert TYPES["version"].held_by(text), text


def test_the_usual_ways_of_writing_a_version_and_a_count_are_found():
    version = TYPES["version"]
    for text in ("use v2", "version 1.2 is required", "Upgrade to 2.2.3 now", "Kubernetes 1.29", "Node 18.x"):
        assert version.held_by(text), text
    for text in ("2024-03-02 09:15 Ana: upgraded", "On 4 June 2024 it changed", "at 10:30 am"):
        assert not version.held_by(text), text
    assert TYPES["number"].held_by("3 retries") and TYPES["number"].held_by("twelve workers")


@pytest.mark.parametrize("text", ["You may retry the job from the console.", "The deploy needs 2000 MB of memory."])
def test_a_modal_may_or_a_four_digit_amount_is_no_date(text):
    assert not TYPES["date"].held_by(text), TYPES["date"].values(text)


@pytest.mark.parametrize("text", ["The brand colour is #ff0000.", "Links are #1a73e8 on #f5f5f5."])
def test_a_colour_is_no_slack_channel(text):
    assert not TYPES["Slack channel"].held_by(text), TYPES["Slack channel"].values(text)


@pytest.mark.parametrize("text", ["npm i @scope/pkg@1.2.3", "pip install pkg==1.0@1.2.3"])
def test_a_package_pin_is_no_email_address(text):
    assert not TYPES["email address"].held_by(text), TYPES["email address"].values(text)


def test_an_llm_answer_writing_version_before_the_cited_number_is_grounded():
    """The cited block says "2.2.3"; the answer says "version 2.2.3": the same value. Since
    "version 2.2.3" is one value, the check looks for the whole phrase in the block and flags
    the answer as ungrounded (it then reads as a decline)."""
    block = _block(1, "Proxy release notes", "The stall was fixed in the proxy 2.2.3 hotfix.", lexical_rank=1)
    question = "Which proxy hotfix version fixed the stall?"
    assert ungrounded_values(question, "Upgrade to version 2.2.3 [1].", [block], [1]) == []
    assert ungrounded_values(question, "Upgrade to v2.2.3 [1].", [block], [1]) == []


@pytest.mark.parametrize(
    ("question", "label"),
    [
        ("How much did each beanbag cost in the pilot?", "amount of money"),  # a price, not any count
        ("What is the referral bonus for engineers?", "amount of money"),
        ("What is the error budget of the API, in percent?", "number"),  # a budget is not always money
        ("what's the per diem for meals?", "amount of money"),
        ("How much memory does the cache use?", "number"),  # an amount, not money
        ("How much time do we spend on reviews?", "number"),  # time is spent, not money
        ("How much memory does the index cost?", "number"),
        ("On what date was the hotfix rolled out?", "calendar date"),  # a day, not a release
        ("Which day is the standup?", "calendar date"),
        ("Which date format does the API accept?", None),  # a format, not a date
        ("What day-to-day work does the team do?", None),
        ("What's the retention period for audit logs?", "number"),  # a quantity named as the head
        ("What is the upload size limit for the API?", "number"),
        ("What's the max retries per job?", "number"),
        ("what was the threshold Ravi used?", "number"),
        ("What is the rate limiter used by the gateway?", None),  # "rate" qualifies "limiter"
        ("Which limit applies to headers?", None),  # which limit: a name, not its value
        ("At what file size does the upload spill to disk?", "number"),  # where a quantity switches
        ("The cache evicts early: at exactly what size does it start?", "number"),
        ("At what point did the deploy fail?", None),  # a moment in a story, not a quantity
        ("Which port does the staging load balancer listen on?", "number"),  # a port is a number
        ("What port of the client to Go is planned?", None),  # porting, not a port
    ],
)
def test_a_price_a_day_and_a_quantity_are_asked_for_as_such(question, label):
    asked = asked_answer_type(question)
    assert (asked.label if asked else None) == label


def test_money_is_found_as_sources_write_it_and_a_bare_count_is_none():
    money = TYPES["amount of money"]
    for text in (
        "Each one cost $1,200.",
        "40 dollars each",
        "USD 300 per seat",
        "1.2k EUR",
        "Tickets are free.",
        "80 US dollars in North America",
        "500 usd",
        "20$ a month",
    ):
        assert money.held_by(text), text
    for text in ("Order up to 4 beanbags.", "Feel free to ask.", "It costs 20% more CPU."):
        assert not money.held_by(text), money.values(text)


def test_a_day_is_found_and_a_version_or_a_year_alone_is_none():
    day = TYPES["calendar date"]
    for text in (
        "Rolled out on 2026-03-18.",
        "Shipped March 3.",
        "Done by the 3rd of March.",
        "Deploys on Friday.",
        "Frozen on Fridays.",
        "At 2024-03-02T10:00:00Z it shipped.",
        "Seit 02.03.2024.",
    ):
        assert day.held_by(text), text
    for text in ("Engineering shipped the v2.2.2 hotfix.", "It changed in 2025.", "At 10:23 UTC it recovered."):
        assert not day.held_by(text), day.values(text)


def test_the_missing_value_note_reads_as_english():
    from search.pipeline.answer_types import missing_type_note

    assert missing_type_note("amount of money").startswith("The sources found do not state an amount of money")
    assert missing_type_note("version").startswith("The sources found do not state a version")


def test_a_list_enumerator_is_no_count():
    number = TYPES["number"]
    assert not number.held_by("3) Create a service account for the project.\n2. Restart the pod")
    assert not number.held_by("Observed details: 1) Customer viewed the invoice")
    assert number.values("We terminated 3 instances.\n1) then 12 more (4)") == ["3", "12", "4"]


ADVERSARIAL = [
    "1," * 50_000,  # a match may start after each comma: quadratic unless starts are ruled out
    "1" * 100_000,
    "1." * 50_000,
    "1.x" * 33_000,
    "a" * 100_000 + "@",
    "a." * 50_000 + "@b",
    "a@b" + ".c" * 50_000 + "!",
    "#" + "a-" * 50_000,
    "Aa " + "1" * 100_000 + ".",
    "Aa" + " " * 100_000 + "1.",
    "may" + " " * 100_000 + "x",
    "2024-01-01T" * 9_000,
    "10:" * 33_000,
    "1st " * 25_000,
    "version " * 12_500,
    "https://" * 12_000,
]


@pytest.mark.parametrize("payload", ADVERSARIAL, ids=lambda p: repr(p[:12]))
def test_the_value_patterns_are_linear_on_100kb(payload):
    start = time.perf_counter()
    for t in ANSWER_TYPES:
        t.held_by(payload)
        t.values(payload)
    assert time.perf_counter() - start < SUPERLINEAR_SECONDS


def test_the_slack_question_pattern_is_linear_on_a_long_question():
    """ "which channel" then "slack" is looked for within 300 characters, not to the end of the text."""
    question = "which channel " * (100_000 // 14)
    start = time.perf_counter()
    asked_answer_type(question)
    assert time.perf_counter() - start < SUPERLINEAR_SECONDS


# -- the gate over constructed evidence --------------------------------------------------------


@pytest.mark.django_db
def test_a_count_written_in_words_over_twelve_answers_a_how_long_question(kb):
    from search.pipeline.gate import judge

    question = "How long does the on-call engineer wait before escalating to the platform team?"
    page = _block(
        1,
        "Runbook > On-call rotation",
        "The on-call engineer waits thirty minutes before escalating to the platform team.",
        lexical_rank=1,
        dense_rank=1,
        similarity=0.8,
    )
    assert judge(question, [page], scope_for_user(kb.acme.admin)).missing_type == ""


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("question", "title", "text"),
    [
        # a modal "may" is no date
        (
            "When was the badge warranty introduced?",
            "Facilities > Badge warranty",
            "Employees may claim the badge warranty at the front desk.",
        ),
        # a step number is no version
        (
            "Which proxy version fixed the badge reader stall?",
            "Badge reader stall",
            "Step 3 of the runbook restarts the proxy after a badge reader stall.",
        ),
        # a count is no price
        (
            "How much did each badge reader cost?",
            "Facilities > Badge readers",
            "Facilities ordered 4 badge readers for the second floor.",
        ),
        # a release is no day
        (
            "On what date was the badge reader proxy hotfix rolled out?",
            "Badge reader proxy",
            "Engineering shipped the badge reader proxy hotfix as v2.2.2.",
        ),
        # an item's number in a list is no count
        (
            "How many badge readers did facilities replace?",
            "Facilities > Badge readers",
            "Steps taken:\n3) Facilities replaced the badge readers on the second floor.",
        ),
    ],
)
def test_text_that_only_looks_like_the_asked_value_does_not_answer(kb, question, title, text):
    from search.pipeline.gate import judge

    page = _block(1, title, text, lexical_rank=1, dense_rank=1, similarity=0.8)
    assert judge(question, [page], scope_for_user(kb.acme.admin)).declines


# -- transcript passages -----------------------------------------------------------------------


def _thread(text, n=1, **kw):
    return _block(n, "#data-eng: export", text, kind="thread", **kw)


def test_odd_transcripts_are_cut_quickly_without_error():
    for text in [
        "",
        "\n\n",
        "Ana:",
        "Ana:\nBo:\n",
        "…",
        " … … ",
        "José María Ñúñez: ¿dónde está el export? ünïcödé",
        "2024-03-02 09:15 " * 500,
        "x" * 100_000,
        "Ana: " + "word " * 20_000,
        "```\n" * 1000,
    ]:
        start = time.perf_counter()
        block_passages(_thread(text))
        assert time.perf_counter() - start < SUPERLINEAR_SECONDS


def test_a_long_chat_message_without_full_stops_keeps_its_end():
    """A 1,100-character message (under the 1,200-character excerpt, so the evidence shows it all)
    with no full stop is cut at word boundaries, its end (the answer) kept."""
    message = "2024-03-02 09:20 Bo: " + "we looked at the export worker and the queue " * 22 + "it skipped 412 orders"
    assert len(message) < 1200
    assert any("412 orders" in p.text for p in block_passages(_thread(message)))


def test_an_ellipsis_typed_in_a_message_does_not_leave_its_answer_unquotable():
    """Slack users (and macOS autocorrect) type "…": only the excerpt's own gap cuts a transcript."""
    text = (
        "2024-03-02 09:15 Ana: the nightly export of the orders table is stuck again\n"
        "2024-03-02 09:20 Bo: hmm… restart the export worker with `kb export --resume` to unstick it"
    )
    passages = block_passages(_thread(text))
    assert any("kb export --resume" in p.text and p.whole for p in passages), [(p.text, p.whole) for p in passages]


def test_a_cut_piece_with_a_colon_early_is_not_a_whole_message():
    """After the excerpt's "…" a piece starts inside a message: "the fix is simple: " is no "Name: " head."""
    text = "2024-03-02 09:15 Ana: export stuck … the fix is simple: restart the export worker"
    passages = block_passages(_thread(text))
    cut = next(p for p in passages if p.text.startswith("the fix"))
    assert not cut.whole


def test_code_in_a_chat_message_is_quoted_as_written():
    """A chat message's fenced code is kept verbatim, as a doc section's is."""
    text = (
        "2024-03-02 09:20 Bo: compute the delay like this\n  ```\n  delay = 2 ** attempt\n  name = sys.argv[1]\n  ```"
    )
    joined = "\n".join(p.text for p in block_passages(_thread(text)))
    assert "2 ** attempt" in joined and "sys.argv[1]" in joined, joined


@pytest.mark.django_db
def test_the_reply_quoted_after_a_message_is_the_next_message_not_a_piece_across_a_gap():
    """The excerpt left out the messages between: the passage after its gap is no reply."""
    from search.pipeline.extractive import extractive_answer

    question = "How do I unstick the nightly export of the orders table?"
    thread = _thread(
        "2024-03-02 09:20 Bo: to unstick the nightly export of the orders table, restart the export "
        "worker with `kb export --resume`\n … \n2024-04-20 12:00 Cy: pizza for the nightly team "
        "lunch is ordered, vote in the sheet",
        lexical_rank=1,
        dense_rank=1,
        similarity=0.8,
    )
    answer = extractive_answer(question, [thread], verdict=scored_verdict(question, [thread]))
    assert "kb export --resume" in answer.text
    assert "pizza" not in answer.text, answer.text


def test_a_confluence_wiki_heading_is_a_heading_not_the_start_of_its_first_sentence():
    """Confluence storage exports write "h2. Root cause"; read as prose, the heading glued to the
    section's first sentence made that sentence a fragment no answer could quote."""
    from search.pipeline.evidence import Evidence

    text = "h1. Private VPC incident\n\nh2. Root cause\nA route table change removed the NAT gateway route."
    ev = Evidence(
        n=1, document_id=1, kind="doc_page", title="VPC incident", url="", text=text, score=1.0, tool="search"
    )
    passages = block_passages(ev)
    assert [p.text for p in passages if p.heading] == ["Private VPC incident", "Root cause"]
    sentence = next(p for p in passages if not p.heading)
    assert sentence.text.startswith("A route table change") and sentence.whole, sentence
