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


@pytest.mark.django_db
def test_the_answer_quotes_a_passage_for_each_asked_clause():
    """The second clause's answer sits in the same document, below passages about the first: a
    ranking by the whole question alone fills the answer with the first clause's passages."""
    from search.pipeline.synthesizer import extractive_answer

    question = "What watchdog did we add to the payment queue, and which team owns the watchdog?"
    text = (
        "After the outage we added a watchdog to the payment queue that restarts stalled consumers. "
        "The payment queue watchdog checks consumer heartbeats every thirty seconds. "
        "The watchdog we added to the payment queue also pages when the backlog grows. "
        "Payment queue consumers that miss two heartbeats are restarted by the watchdog. "
        "Ownership: the Platform Reliability team owns the watchdog and its alerts."
    )
    block = _block(1, "Payment queue watchdog", text, lexical_rank=1, dense_rank=1, similarity=0.8)
    answer = extractive_answer(question, [block], verdict=scored_verdict(question, [block]))
    assert "restarts stalled consumers" in answer.text or "checks consumer heartbeats" in answer.text, answer.text
    assert "Platform Reliability" in answer.text, answer.text


@pytest.mark.django_db
def test_a_clause_answered_beyond_the_blocks_excerpt_is_read_from_the_whole_row():
    """The reader's excerpt (``Evidence.text``) was chosen for the whole question; the answer to
    its second clause sits further on in the same row (``Evidence.body``) and is quoted from there."""
    from search.pipeline.synthesizer import extractive_answer

    question = "How do I rotate the signing key, and how long is the old key still accepted?"
    head = "To rotate the signing key, run `kb keys rotate` on the primary; replicas pick up the new key."
    filler = " ".join(f"Step {i}: the operator checks dashboard panel {i} for errors." for i in range(40))
    tail = "After a rotation the old key is still accepted for 48 hours, then it is revoked."
    body = f"{head} {filler} {tail}"
    block = _block(1, "Signing keys", head, lexical_rank=1, dense_rank=1, similarity=0.8, body=body)
    answer = extractive_answer(question, [block], verdict=scored_verdict(question, [block]))
    assert "kb keys rotate" in answer.text, answer.text
    assert "48 hours" in answer.text, answer.text
