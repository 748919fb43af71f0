"""Evaluation: question files in both formats, the metrics' arithmetic, and kb_eval end to end."""

import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from search.evaluation import EvalInputError, Question, load_questions, score_question
from search.retrieval import Hit

pytestmark = pytest.mark.slow  # indexes an evaluation corpus


def _hit(path="", start=None, end=None, kind="doc_section", external_id="x", metadata=None):
    return Hit(
        document_id=1,
        source_id=1,
        kind=kind,
        title="t",
        url="",
        path=path,
        start_line=start,
        end_line=end,
        content="",
        text="",
        metadata=metadata or {},
        updated_at=None,
        parent_id=None,
        external_id=external_id,
    )


def test_load_questions_reads_both_formats_and_names_bad_lines(tmp_path):
    f = tmp_path / "q.jsonl"
    f.write_text(
        json.dumps({"id": "a", "type": "docs", "question": "Q1?", "gold": [{"kind": "doc", "path": "p.md"}]})
        + "\n\n"
        + json.dumps({"question_id": "b", "question_type": "basic", "question": "Q2?", "expected_doc_ids": ["d1"]})
        + "\n"
    )
    qs = load_questions(f)
    assert [(q.id, q.type, q.gold) for q in qs] == [
        ("a", "docs", [{"kind": "doc", "path": "p.md"}]),
        ("b", "basic", [{"kind": "doc_id", "id": "d1"}]),
    ]
    f.write_text('{"id": "a", "question": "Q?", "gold": []}\n{not json\n')
    with pytest.raises(EvalInputError, match=r"q.jsonl:2: invalid JSON"):
        load_questions(f)
    with pytest.raises(EvalInputError, match="does not exist"):
        load_questions(tmp_path / "missing.jsonl")


def test_metrics_follow_the_definitions():
    q = Question(
        id="q",
        type="code",
        text="?",
        gold=[{"kind": "code", "path": "a.py", "line": 12}, {"kind": "commit", "pr": 7}],
    )
    hits = [
        _hit("a.py", 1, 200, kind="code_file"),  # a whole-file row does not count
        _hit("b.md"),
        _hit("a.py", 10, 20, kind="code_chunk"),
        _hit(kind="commit", metadata={"pr_number": 7}),
    ]
    r = score_question(q, hits, latency_ms=5.0)
    assert r.first_relevant_rank == 3
    assert r.recall == {1: 0.0, 3: 0.5, 10: 1.0}
    ideal = 1 + 1 / 1.5849625007211563
    assert r.ndcg10 == pytest.approx((1 / 2 + 1 / 2.321928094887362) / ideal)


@pytest.mark.django_db
def test_kb_eval_indexes_the_erb_corpus_and_scores_a_custom_questions_file(tmp_path, capsys, shared_dir):
    first = json.loads((shared_dir / "eval/erb/questions.jsonl").read_text().splitlines()[0])
    f = tmp_path / "one.jsonl"
    f.write_text(json.dumps(first) + "\n")
    call_command("kb_eval", "--set", "erb", "--questions", str(f), "--json")
    report = json.loads(capsys.readouterr().out)
    assert report["overall"]["n"] == 1
    assert report["overall"]["recall@10"] == 1.0
    assert report["questions"][0]["id"] == first["question_id"]
    with pytest.raises(CommandError, match="does not exist"):
        call_command("kb_eval", "--set", "erb", "--questions", str(tmp_path / "nope.jsonl"))


@pytest.mark.django_db
def test_answer_evaluation_scores_declines_citations_and_judged_facts(kb, settings):
    from search.evaluation_answers import evaluate_answers
    from sources.selectors import scope_for_user
    from tests.llm_server import FakeOpenAIServer

    questions = [
        Question(
            id="u1", type="unanswerable", text="How is the per-request CO2e of billing computed with kv_crc?", gold=[]
        ),
        Question(
            id="a1",
            type="basic",
            text="How do I deploy the billing service?",
            gold=[{"kind": "doc_id", "id": "runbook#deploy"}],
            facts=["Deploy with make release.", "Deploys need a pager."],
        ),
    ]
    scope = scope_for_user(kb.acme.admin)
    report = evaluate_answers(questions, scope, judge=False)
    assert report["unanswerable_declined"] == 1.0 and report["answerable_declined"] == 0.0
    assert report["citations"]["validity"] == 1.0 and report["citations"]["removed"] == 0
    assert report["by_type"]["basic"]["cited_gold"] == 1.0 and report["overall"]["facts"] is None
    assert report["latency_ms"]["first_token_p50"] > 0

    # With a judge: the loopback LLM says the first fact is stated and the second is not.
    def judge(body):
        return json.dumps({"stated": "make release" in body["messages"][-1]["content"].split("FACT:")[1]})

    with FakeOpenAIServer(judge) as server:
        settings.OPENAI_BASE_URL, settings.OPENAI_API_KEY, settings.KB_LLM_MODEL = server.base_url, "k", "m"
        from search.evaluation_answers import judge_fact

        assert judge_fact("Run make release [1].", "Deploy with make release.") is True
        assert judge_fact("Run make release [1].", "Deploys need a pager.") is False


def test_a_quoted_evidence_line_is_not_the_answer_declining():
    """An extractive answer quoting a log line "403 with message 'tenant not found'" states the
    evidence's words, not that the sources lack the answer: it is answered. The same words in an
    LLM's answer are its own, and decline (under a partial verdict; under an answered one see
    ``test_an_llm_draft_declining_what_the_gate_found_answered_gives_way_to_the_sources``)."""
    from search.pipeline.checks import check_answer
    from search.pipeline.drafts import Draft
    from search.pipeline.evidence import Evidence
    from search.pipeline.gate import Verdict

    evidence = [
        Evidence(
            n=3,
            document_id=3,
            kind="doc_section",
            title="Auth failures",
            url="",
            score=1.0,
            tool="search",
            text="Observe 403 with message 'tenant not found'.",
            lexical_rank=1,
        )
    ]
    quoted = "Observe 403 with message 'tenant not found' [3]."
    verdict = Verdict(status="answered")
    extractive = check_answer("Why do logins fail?", evidence, verdict, Draft(quoted, [3], "extractive", answers=True))
    assert extractive.answered and extractive.checks == []
    partial = Verdict(status="partial", missing_terms=("SAML",))
    llm = check_answer(
        "Why do logins fail?", evidence, partial, Draft("The sources do not mention it [3].", [3], "llm", answers=True)
    )
    assert not llm.answered


@pytest.mark.django_db
def test_an_llm_draft_declining_what_the_gate_found_answered_gives_way_to_the_sources():
    """The gate decides whether the sources answer; a model's draft that only declines (citing
    nothing) where the evidence model and the LLM's sufficiency judgement both found the sources
    answer is replaced by the extractive answer quoting them (check ``declines_answered``), which
    counts as answered. Under a partial verdict, where the rule alone decided (the judgement
    failed), or when the draft cites evidence (a negative fact, a caveat), the draft stands as
    written and counts as declined."""
    from dataclasses import replace

    from search.pipeline.checks import check_answer
    from search.pipeline.drafts import Draft
    from search.pipeline.evidence import Evidence
    from search.pipeline.gate import Verdict
    from tests.search.conftest import scored_verdict

    evidence = [
        Evidence(
            n=1,
            document_id=1,
            kind="doc_section",
            title="Tenant service restarts",
            url="",
            score=1.0,
            tool="search",
            text="The tenant service restarts nightly at two in the morning, after the backup job.",
            lexical_rank=1,
            dense_rank=1,
        )
    ]
    question = "When does the tenant service restart?"
    verdict = replace(scored_verdict(question, evidence), decided_by="evidence and llm")
    assert verdict.answered
    hedged = Draft("The sources do not specify when the tenant service restarts.", [], "llm", answers=True)
    answer = check_answer(question, evidence, verdict, hedged)
    assert answer.answered and answer.synthesizer == "extractive" and answer.cited == [1]
    assert "two in the morning" in answer.text and "do not specify" not in answer.text
    assert answer.checks == ["declines_answered"] and "quotes the sources instead" in answer.error

    ruled = replace(verdict, decided_by="evidence")  # the LLM's judgement failed: the rule alone said yes
    partial = Verdict(status="partial", missing_focus="window")
    for kept_under in (ruled, partial):
        kept = check_answer(question, evidence, kept_under, hedged)
        assert not kept.answered and "do not specify" in kept.text and kept.synthesizer == "llm"
        assert "declines_answered" not in kept.checks

    caveat = Draft("It restarts nightly [1]. The sources do not mention a restart window.", [1], "llm", answers=True)
    kept = check_answer(question, evidence, verdict, caveat)
    assert kept.synthesizer == "llm" and "restart window" in kept.text and not kept.answered
    assert "declines_answered" not in kept.checks
