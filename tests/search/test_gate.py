"""The answerability gate: relevance and coverage of the question's terms by readable documents."""

import pytest

from search.pipeline.gate import (
    PARTIAL_WEIGHT,
    Coverage,
    missing_terms_note,
    question_coverage,
    question_terms,
    text_declines,
)
from sources.selectors import scope_for_user


def test_question_terms_keep_quoted_spans_whole_and_mark_specific_terms():
    terms = dict(question_terms('How is `kv_crc` computed for "safe mode boot" on H100/A100 nodes in CSRL?'))
    assert terms["kv_crc"] is True
    assert terms["safe mode boot"] is True
    assert terms["H100"] is True and terms["A100"] is True  # split on "/", digits make them specific
    assert terms["CSRL"] is True  # an acronym
    assert terms["computed"] is False and terms["nodes"] is False


@pytest.mark.django_db
def test_terms_the_sources_never_mention_are_named(kb):
    scope = scope_for_user(kb.acme.admin)
    covered = question_coverage("How do I deploy the billing service with make release?", scope)
    assert covered.unknown == () and not covered.partial
    missing = question_coverage("How is the per-request CO2e of billing computed with kv_crc?", scope)
    assert missing.unknown == ("CO2e", "kv_crc")
    assert missing.weight == 4 and missing.weight >= PARTIAL_WEIGHT and missing.partial


@pytest.mark.django_db
def test_coverage_counts_only_documents_the_asker_may_read(kb):
    question = "what are the quokka salary bands"
    # The admin may read the restricted HR page, so "quokka" is known to them...
    assert "quokka" not in question_coverage(question, scope_for_user(kb.acme.admin)).unknown
    # ...but not to a member, and not to another tenant: the note must not reveal the page.
    assert "quokka" in question_coverage(question, scope_for_user(kb.acme_member)).unknown
    assert "quokka" in question_coverage(question, scope_for_user(kb.globex.admin)).unknown


@pytest.mark.parametrize(
    ("text", "declines"),
    [
        ("The sources do not contain the answer.", True),
        ("The evidence doesn't specify the retention period [2].", True),
        ("This is not mentioned in the documents.", True),
        ("There is no information about carbon accounting.", True),
        ("Deploy with `make release` [1]; it does not need a ticket [2].", False),
        ("Run the reconciliation job [3].", False),
    ],
)
def test_text_declines_recognises_a_decline(text, declines):
    assert text_declines(text) is declines


def test_missing_terms_note_names_the_terms_and_reads_as_a_decline():
    note = missing_terms_note(Coverage(unknown=("CO2e", "kv_crc"), weight=4))
    assert "“CO2e”" in note and "“kv_crc”" in note
    assert text_declines(note)
