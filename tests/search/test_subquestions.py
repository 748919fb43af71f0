"""A question as the clauses it asks: each asked thing found, nothing asked invented.

Answer extraction quotes a passage for each asked clause, so a clause lost is a part of the
question left unanswered, and a clause invented (a context sentence, one alternative of an "or",
a quoted error message) pulls in a passage nobody asked for.
"""

from __future__ import annotations

import pytest

from search.pipeline.subquestions import sub_questions
from tests.search.conftest import scored_verdict
from tests.search.test_gate import _block


def _texts(question: str) -> list[str]:
    return [s.text for s in sub_questions(question)]


def _extract(question: str, evidence: list):
    """The extractive answer to ``question`` over ``evidence``, its passages scored by terms alone."""
    from search.pipeline.extractive import extractive_answer

    return extractive_answer(question, evidence, verdict=scored_verdict(question, evidence))


def test_two_questions_joined_by_and_are_two_clauses():
    assert _texts("What watchdog did we add after the outage, and which team owns it?") == [
        "What watchdog did we add after the outage",
        "which team owns it",
    ]


def test_a_sentence_that_asks_nothing_is_no_clause():
    found = _texts("Our CI builds the app in a separate step. How do I skip the startup check?")
    assert found == ["How do I skip the startup check"]


def test_chat_without_capitals_or_question_marks_is_still_split_into_sentences():
    found = _texts("we upgraded the runner last week. what was cut off in the logs")
    assert found == ["what was cut off in the logs"]


def test_a_second_sentence_asking_is_a_second_clause():
    found = _texts("How do I stop the check? What happens if the folder is still missing?")
    assert found == ["How do I stop the check", "What happens if the folder is still missing"]


def test_a_quoted_error_message_is_never_split():
    question = 'Why does the worker log "who owns this lock, and when does it expire" on start?'
    assert _texts(question) == [question.rstrip("?")]


def test_alternatives_joined_by_or_stay_one_clause():
    question = "Will it serve the templates, or only the plain files?"
    assert _texts(question) == [question.rstrip("?")]


def test_a_short_trailing_question_stays_with_the_clause_before_it():
    found = sub_questions("Who approved the vendor contract and when?")
    assert len(found) == 1
    assert "when" in found[0].text and "vendor contract" in found[0].text


def test_a_leading_phrase_that_asks_nothing_is_the_clause_context():
    found = sub_questions("For the softball team, when is the next practice and who books the field?")
    assert [s.text for s in found] == ["when is the next practice", "who books the field"]
    assert found[0].context == "For the softball team"


def test_a_clause_led_by_a_preposition_keeps_it():
    found = _texts("Which PO did finance raise, and at what rate is it billed?")
    assert found == ["Which PO did finance raise", "at what rate is it billed"]


def test_each_clause_carries_the_form_of_value_it_asks_for():
    first, second = sub_questions("Which team owns the export job, and when did it last fail?")
    assert second.asked is not None and second.asked.label == "date", second
    assert first.asked is None or first.asked.label != "date", first
    assert [first.index, second.index] == [0, 1]


@pytest.mark.parametrize("question", ["", "   ", "?", "deploy runbook"])
def test_a_question_the_syntax_does_not_split_is_one_clause_of_its_whole_text(question):
    found = sub_questions(question)
    assert len(found) == 1
    assert found[0].text == question.strip().rstrip("?").strip()


@pytest.mark.parametrize(
    "question",
    [
        "How do I configure CORS, which I need for the frontend?",  # a relative clause
        "What should we do, when the streaming watchdog fires?",  # a subordinate clause
    ],
)
def test_a_clause_that_relates_rather_than_asks_stays_with_its_question(question):
    assert len(sub_questions(question)) == 1


def test_a_bare_comma_before_an_inverted_question_splits():
    found = _texts("which PO did they add, what GL code are we using, and when does it get paid?")
    assert found == ["which PO did they add", "what GL code are we using", "when does it get paid"]


@pytest.mark.parametrize(
    ("question", "expected"),
    [
        ("Dr. Smith approved it. Who is Dr. Smith?", ["Who is Dr. Smith"]),
        (
            "Was ist am 3. Februar passiert? Wer hat es behoben?",
            ["Was ist am 3. Februar passiert", "Wer hat es behoben"],
        ),
        ("谁批准了合同？ who owns it?", ["谁批准了合同", "who owns it"]),
    ],
)
def test_a_full_stop_that_ends_no_sentence_does_not_split_and_other_scripts_question_marks_do(question, expected):
    assert _texts(question) == expected


@pytest.mark.parametrize(
    ("question", "expected"),
    [
        ("We use Redis etc. What is the TTL, and who owns the cache?", ["What is the TTL", "who owns the cache"]),
        ("The INC-42 outage hit Postgres 14. What caused it, and who fixed it?", ["What caused it", "who fixed it"]),
    ],
)
def test_an_abbreviation_or_number_ending_a_sentence_before_a_question_ends_it(question, expected):
    assert _texts(question) == expected


def test_a_question_mark_inside_a_link_ends_no_sentence():
    question = "Is https://example.com/search?q=foo down?"
    assert _texts(question) == [question.rstrip("?")]


def test_a_nul_in_the_question_is_no_quote_placeholder():
    found = sub_questions('What is \x000\x00 and who owns "the lock"?')
    assert [s.text for s in found][-1] == 'who owns "the lock"'


@pytest.mark.django_db
def test_the_answer_quotes_a_passage_for_each_asked_clause():
    """The second clause's answer sits in the same document, below passages about the first: a
    ranking by the whole question alone fills the answer with the first clause's passages."""
    question = "What watchdog did we add to the payment queue, and which team owns the watchdog?"
    text = (
        "After the outage we added a watchdog to the payment queue that restarts stalled consumers. "
        "The payment queue watchdog checks consumer heartbeats every thirty seconds. "
        "The watchdog we added to the payment queue also pages when the backlog grows. "
        "Payment queue consumers that miss two heartbeats are restarted by the watchdog. "
        "Ownership: the Platform Reliability team owns the watchdog and its alerts."
    )
    block = _block(1, "Payment queue watchdog", text, lexical_rank=1, dense_rank=1, similarity=0.8)
    answer = _extract(question, [block])
    assert "restarts stalled consumers" in answer.text or "checks consumer heartbeats" in answer.text, answer.text
    assert "Platform Reliability" in answer.text, answer.text


@pytest.mark.django_db
def test_a_clause_answered_beyond_the_blocks_excerpt_is_read_from_the_whole_row():
    """The reader's excerpt (``Evidence.text``) was chosen for the whole question; the answer to
    its second clause sits further on in the same row (``Evidence.body``) and is quoted from there."""
    question = "How do I rotate the signing key, and how long is the old key still accepted?"
    head = "To rotate the signing key, run `kb keys rotate` on the primary; replicas pick up the new key."
    filler = " ".join(f"Step {i}: the operator checks dashboard panel {i} for errors." for i in range(40))
    tail = "After a rotation the old key is still accepted for 48 hours, then it is revoked."
    body = f"{head} {filler} {tail}"
    block = _block(1, "Signing keys", head, lexical_rank=1, dense_rank=1, similarity=0.8, body=body)
    answer = _extract(question, [block])
    assert "kb keys rotate" in answer.text, answer.text
    assert "48 hours" in answer.text, answer.text


@pytest.mark.django_db
def test_a_later_clause_is_answered_by_the_field_line_beside_the_earlier_clauses_answer():
    """Action items each with their owner: "which team owns it" is the owner line after the
    item the first clause found, though every owner line covers the clause as well."""
    question = "What watchdog did we commit to adding to the stream proxy, and which team owns it?"
    text = (
        "Action items from the review of the stream proxy hang.\n\n"
        "1) Add alerting on gateway backpressure saturation across all proxy pools.\n\nOwning team: Eng SRE.\n\n"
        "2) Add a runtime-side watchdog to the stream proxy that forces a flush after two idle seconds.\n\n"
        "Owning team: Eng Serving Runtime.\n\n"
        "3) Document the flush configuration of every proxy pool for on-call engineers.\n\nOwning team: Eng Platform."
    )
    block = _block(1, "Stream proxy hang postmortem", text, lexical_rank=1, dense_rank=1, similarity=0.8)
    answer = _extract(question, [block])
    assert "runtime-side watchdog" in answer.text, answer.text
    assert "Eng Serving Runtime" in answer.text, answer.text
    assert "Eng SRE" not in answer.text and "Eng Platform" not in answer.text, answer.text


@pytest.mark.django_db
def test_a_clause_nothing_in_the_evidence_speaks_to_gets_no_quote_from_an_unrelated_document():
    question = "How do I rotate the signing key, and who won the company softball final?"
    keys = "To rotate the signing key, run `kb keys rotate` on the primary; replicas pick up the new key."
    notes = "Release notes for the billing export list the new CSV columns added this quarter."
    evidence = [
        _block(1, "Signing keys", keys, lexical_rank=1, dense_rank=1, similarity=0.8),
        _block(2, "Billing export", notes, lexical_rank=2, dense_rank=2, similarity=0.4),
    ]
    answer = _extract(question, evidence)
    assert "kb keys rotate" in answer.text, answer.text
    assert "billing export" not in answer.text, answer.text


@pytest.mark.django_db
def test_an_identifier_one_clause_names_does_not_keep_the_other_clause_from_its_own_document():
    question = "What broke outbound traffic in the VPC-17 incident, and what is the total due on the Acme invoice?"
    said = "In the VPC-17 incident a route table change broke outbound traffic through the NAT gateway."
    incident = _block(1, "VPC-17 postmortem", said, lexical_rank=1, dense_rank=1, similarity=0.7)
    billed = "Invoice for Acme Cloud Services, February. Total due on the Acme invoice: $12,345.00, payable in 30 days."
    invoice = _block(2, "Acme invoice", billed, lexical_rank=2, dense_rank=2, similarity=0.6)
    evidence = [incident, invoice]
    answer = _extract(question, evidence)
    assert "route table" in answer.text, answer.text
    assert "$12,345.00" in answer.text, answer.text


@pytest.mark.django_db
def test_an_identifier_of_a_context_sentence_binds_every_clause():
    """The context names the incident; both clauses ask about it, and another incident's page
    answering "what was the root cause" in the same words is no answer."""
    question = "During the VPC-17 rollout, tenants saw 401s. What was the root cause, and what fix resolved it?"
    ours = (
        "In the VPC-17 rollout the root cause was a TLS renegotiation setting that broke older clients. "
        "The fix that resolved the VPC-17 failures was rolling back the TLS library change."
    )
    other = "Alternative root cause considered for the March outage: a cache flush, rejected after tracing."
    evidence = [
        _block(1, "VPC-17 rollout postmortem", ours, lexical_rank=1, dense_rank=1, similarity=0.7),
        _block(2, "March outage postmortem", other, lexical_rank=2, dense_rank=2, similarity=0.6),
    ]
    answer = _extract(question, evidence)
    assert "TLS renegotiation" in answer.text and "rolling back" in answer.text, answer.text
    assert "cache flush" not in answer.text, answer.text


@pytest.mark.django_db
def test_three_clauses_answered_in_one_document_get_three_quotes():
    question = "Which PO did finance add to the invoice, what GL code is the invoice coded to, and when is it paid?"
    text = (
        "Finance added PO R-9987 to the corrected invoice from the vendor. "
        "The invoice is coded to GL 5-1200, the cloud infrastructure account. "
        "It is paid in the payment run on 2026-03-17, as the terms are net thirty."
    )
    block = _block(1, "Vendor invoice thread", text, lexical_rank=1, dense_rank=1, similarity=0.7)
    answer = _extract(question, [block])
    for value in ("R-9987", "GL 5-1200", "2026-03-17"):
        assert value in answer.text, answer.text


def test_a_run_of_code_lines_holding_no_word_is_never_quoted():
    """Its block's title lends it the question's terms; it still says nothing."""
    from search.pipeline.extractive import best_passages
    from search.pipeline.gate import Verdict
    from search.pipeline.passages import Passage, ScoredEvidence

    question = "Where does the exception handler return the error response?"
    wordless = Passage(n=1, text="    )\n)", order=1, code=True, coverage=0.9, similarity=0.5)
    said = Passage(n=1, text="    return JSONResponse(exc.detail)", order=0, code=True, coverage=0.6, similarity=0.5)
    block = _block(1, "exception handler error response", f"{said.text}\n{wordless.text}", kind="code_chunk")
    verdict = Verdict(status="answered", scored=ScoredEvidence(weights={}, passages=[wordless, said]))
    assert [p.text for p in best_passages(question, [block], verdict)] == [said.text]


@pytest.mark.django_db
def test_a_clause_referring_back_is_not_answered_from_a_block_lacking_the_earlier_identifier():
    question = "What did PR-4821 change in the retry loop, and who reviewed it?"
    ours = (
        "PR-4821 changed the retry loop to back off exponentially with jitter. "
        "Dana Whitfield approved the change before the release."
    )
    other = "Lee Okafor reviewed the logging pull request and approved it after two rounds of comments."
    evidence = [
        _block(1, "PR-4821 retry backoff", ours, lexical_rank=1, dense_rank=1, similarity=0.7),
        _block(2, "Logging pull request", other, lexical_rank=2, dense_rank=2, similarity=0.6),
    ]
    answer = _extract(question, evidence)
    assert "exponentially" in answer.text and "Dana Whitfield" in answer.text, answer.text
    assert "Lee Okafor" not in answer.text and "[2]" not in answer.text, answer.text
