"""Query-biased passages: a long record or thread is shown to the reader and the LLM where it
matches the question, not from its head (``search.pipeline.evidence.query_passage``)."""

import json

import pytest

from search.pipeline.evidence import PASSAGE_GAP, Evidence, evidence_from_hit, query_passage
from search.pipeline.synthesizer import LLM_BLOCK_CHARS, evidence_prompt
from search.retrieval import Hit

# ERB qst_0387: the thread's go-live dates are its last lines, 4.5k characters in.
QUESTION = (
    "What were the target go-live dates for the next rollout batch for the EU West region and the "
    "Southeast Asia region mentioned in the region launch coordination thread?"
)


@pytest.fixture
def thread(shared_dir) -> str:
    doc = json.loads((shared_dir / "eval/erb/docs/slack/1711002345-eu-apac-region-go-live-coord.json").read_text())
    return doc["text"]


def test_a_long_thread_is_shown_where_it_answers(thread):
    assert len(thread) > 4000 and "6/1" not in thread[:1200]
    passage = query_passage(QUESTION, thread, 1200)
    assert len(passage) <= 1200
    assert "EU-West-3 go-live by 6/1" in passage and "AP-SOUTHEAST-1 by 6/8" in passage
    # Verbatim lines of the body, in document order; pieces joined by the gap mark.
    pieces = [p.strip() for p in passage.split(PASSAGE_GAP.strip()) if p.strip()]
    assert len(pieces) > 1
    lines = [line for piece in pieces for line in piece.split("\n")]
    positions = [thread.find(line) for line in lines]
    assert -1 not in positions and positions == sorted(positions)


def test_a_body_that_fits_or_matches_nothing_is_kept_from_its_start(thread):
    assert query_passage(QUESTION, "short text", 1200) == "short text"
    assert query_passage("zzyzx qwvb", thread, 500) == thread[:500]
    assert query_passage("", thread, 500) == thread[:500]


def test_lines_score_by_tf_isf_so_a_word_on_every_line_weighs_little():
    body = "\n".join(f"Redwood note {i}: filler text about lunch plans and parking." for i in range(40))
    body += "\nRedwood escalation: the pager rotation changed to weekly.\n"
    body += "\n".join(f"Redwood note {i}: more filler about the coffee machine." for i in range(40, 80))
    passage = query_passage("Redwood pager rotation", body, 200)
    assert "the pager rotation changed to weekly" in passage
    assert passage.startswith(PASSAGE_GAP.lstrip())  # the head was not chosen, so the passage says so
    assert len(passage) <= 200


def _hit(kind: str, content: str) -> Hit:
    return Hit(
        document_id=1,
        source_id=1,
        kind=kind,
        title="t",
        url="",
        path="p.py",
        start_line=1,
        end_line=99,
        content=content,
        text=content,
        metadata={},
        updated_at=None,
        parent_id=None,
        external_id="x",
    )


def test_records_are_excerpted_for_the_question_and_code_stays_contiguous(thread):
    record = evidence_from_hit(_hit("record", thread), tool="search", query=QUESTION)
    assert "6/8" in record.text
    assert evidence_from_hit(_hit("record", thread), tool="search").text == thread[:1200]
    code = evidence_from_hit(_hit("code_chunk", thread), tool="search", query=QUESTION)
    assert code.text == thread[:1200]


def test_the_llm_prompt_shows_each_block_where_it_matches(thread):
    ev = Evidence(n=1, document_id=1, kind="thread", title="go-live", url="", text=thread[:3000], score=0, tool="s")
    ev.text = query_passage(QUESTION, thread, 1200)
    prompt = evidence_prompt(QUESTION, [ev])
    block = prompt.split("[1] ", 1)[1].split("Question:", 1)[0]
    assert "6/1" in block and "6/8" in block
    assert len(block) < LLM_BLOCK_CHARS + 200  # the block's passage, its header and indentation


def test_content_terms_keep_dates_times_versions_and_ids_whole():
    from search.text import content_terms

    terms = content_terms("Go-live is 6/1 for EU-West-3, due Thu 18:00 [1]; proxy v2.2.3. Deployments in 2026.")
    assert {"6/1", "eu-west-3", "18:00", "v2.2.3", "2026"} <= terms
    assert {"deploy", "proxy", "thu"} <= terms and "1" not in terms and "for" not in terms


def test_an_uncited_sentence_stating_dates_is_attributed_to_the_block_holding_them(thread):
    """ERB qst_0387: qwen-1.5b answered with the two dates and region ids and cited nothing;
    every word it added beyond the question is a date or an id."""
    from search.pipeline.checks import attribute_citations

    ev = Evidence(
        n=1,
        document_id=1,
        kind="thread",
        title="go-live",
        url="",
        score=0,
        tool="s",
        text=query_passage(QUESTION, thread, 1200),
    )
    other = Evidence(
        n=2,
        document_id=2,
        kind="thread",
        title="capacity",
        url="",
        score=0,
        tool="s",
        text="EU-West capacity shortage on 2025-03-03 in eu-west-1.",
    )
    draft = "The target go-live dates are 6/1 for EU-West-3 and 6/8 for AP-SOUTHEAST-1."
    text, cited = attribute_citations(QUESTION, draft, [other, ev])
    assert cited == [1] and text.endswith("AP-SOUTHEAST-1 [1].")
