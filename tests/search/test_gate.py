"""The answerability gate: relevance and coverage of the question's terms by readable documents."""

import pytest

from search.pipeline.evidence import Evidence
from search.pipeline.gate import (
    PARTIAL_WEIGHT,
    Coverage,
    asked_answer_type,
    judge,
    missing_terms_note,
    missing_type_note,
    question_coverage,
    question_terms,
    text_declines,
    unstated_type_note,
)
from search.pipeline.synthesizer import extractive_answer
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


@pytest.mark.parametrize(
    ("question", "label"),
    [
        ("In the registry, what Slack channel is listed as the ownership contact?", "Slack channel"),
        ("Which channels in Slack announce deploys?", "Slack channel"),
        ("Which channel does the Go worker read jobs from?", None),  # not a Slack channel
        ("What email address do I write to for badge access?", "email address"),
        ("Which proxy hotfix version resolved it?", "version"),
        ("How many incident writeups describe a fallback?", "number"),
        ("How much were the three invoices?", "number"),
        ("What link has the runbook?", "link"),
        # Asking for other things, or "when" as a condition rather than a date: no form asked for.
        ("When we use the GPU firmware operator, what BIOS settings are included?", None),
        ("Who approves terminating test instances?", None),
        ("What is the channel strategy for partners?", None),  # "channel strategy" is not a Slack channel
    ],
)
def test_asked_answer_type_recognises_the_form_of_value_asked_for(question, label):
    asked = asked_answer_type(question)
    assert (asked.label if asked else None) == label


@pytest.mark.parametrize(
    ("label", "text", "held"),
    [
        ("Slack channel", "Ask in #billing-ops [1].", True),
        ("Slack channel", "The owner is `hosted.chat.us-east` [2]; see issue #4521.", False),
        ("number", "Four writeups describe it [1].", True),
        ("number", "Several writeups describe it [1] [2].", False),  # citations are not numbers
        ("version", "Upgrade the proxy to v2.2.3 [1].", True),
        ("version", "Upgrade the proxy [1].", False),
    ],
)
def test_a_value_of_the_asked_form_is_found_outside_citations(label, text, held):
    from search.pipeline.gate import ANSWER_TYPES

    kind = next(t for t in ANSWER_TYPES if t.label == label)
    assert kind.held_by(text) is held


def _relevant(n, title, text):
    return Evidence(n=n, document_id=n, kind="doc_section", title=title, url="", text=text, score=1.0,
                    tool="search", lexical_rank=n)  # fmt: skip


@pytest.mark.django_db
def test_evidence_with_no_value_of_the_asked_form_cannot_answer(kb):
    """ERB qst_0988 asks which Slack channel owns a status component; the sources list owner
    teams. Evidence naming no channel at all makes the verdict partial and the answer a decline."""
    scope = scope_for_user(kb.acme.admin)
    question = "Which Slack channel owns deploying the billing service?"
    teams = [
        _relevant(1, "Runbook > Deploying", "To deploy the billing service run make release; owner: Payments team.")
    ]
    verdict = judge(question, teams, scope)
    assert verdict.relevant and verdict.missing_type == "Slack channel" and verdict.declines
    answer = extractive_answer(question, teams, verdict=verdict)
    assert answer.text.startswith(missing_type_note("Slack channel")) and not answer.answered
    assert text_declines(answer.text) and answer.cited == [1]

    channel = [*teams, _relevant(2, "Deploys", "Deploy questions go to #billing-ops before release.")]
    verdict = judge(question, channel, scope)
    assert verdict.missing_type == "" and not verdict.declines
    assert extractive_answer(question, channel, verdict=verdict).answered

    # A thread holds its own channel, as the synthesizer's invented-name check already counted it.
    thread = _relevant(3, "Deploy day", "Ana: release is out, billing looks fine.")
    thread.metadata = {"channel": "billing-ops"}
    assert judge(question, [*teams, thread], scope).missing_type == ""


def test_the_type_notes_read_as_declines():
    assert text_declines(missing_type_note("Slack channel"))
    assert text_declines(unstated_type_note("number"))
