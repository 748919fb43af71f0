"""A question as the clauses it asks: each asked thing found, nothing asked invented.

Answer extraction quotes a passage for each asked clause, so a clause lost is a part of the
question left unanswered, and a clause invented (a context sentence, one alternative of an "or",
a quoted error message) pulls in a passage nobody asked for.
"""

from __future__ import annotations

import pytest

from search.pipeline.subquestions import sub_questions


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

