"""The ask pipeline: rule-based and LLM planners, executor, extractive and LLM synthesizers."""

import json

import pytest

from search.pipeline.gate import EMPTY_SCOPE_NOTE, NO_EVIDENCE_NOTE
from search.pipeline.planner import rule_plan
from search.pipeline.synthesizer import validate_citations
from search.retrieval import EmptyQuery
from search.services import ask
from sources.selectors import scope_for_user
from tests.llm_server import FakeOpenAIServer, ServerError
from tests.search.conftest import scored_verdict


def _judge_call(body) -> bool:
    """The gate's sufficiency judgement (answered "yes" by the scripted servers below)."""
    return body["messages"][0]["content"].startswith("You check whether numbered evidence")


def test_rule_planner_routes_by_question_shape():
    assert rule_plan("how do vacations work").tool_names == ["search"]
    assert rule_plan("where is compute_backoff defined").tool_names == ["search", "search_code"]
    assert "search_slack" in rule_plan("what did the team discuss in the billing channel").tool_names
    assert "recent_prs" in rule_plan("what changed recently in billing").tool_names


@pytest.mark.django_db
def test_extractive_answer_cites_the_right_evidence(kb):
    result = ask("How do I deploy the billing service?", scope_for_user(kb.acme.admin))
    assert result.answer.synthesizer == "extractive"
    assert result.answer.answered
    assert result.answer.cited, result.answer.text
    first = result.sources[0]
    assert first.title == "Runbook > Deploying the billing service"
    assert f"[{first.n}]" in result.answer.text
    assert "make release" in result.answer.text
    # Every cited number points at a real evidence block; sources are exactly the cited ones.
    assert {e.n for e in result.sources} == set(result.answer.cited)


@pytest.mark.django_db
def test_says_plainly_when_nothing_relevant(kb):
    result = ask("qwxzy vbnmk plorf", scope_for_user(kb.acme.admin))
    assert result.answer.text == NO_EVIDENCE_NOTE
    assert not result.answer.answered
    assert result.sources == []


@pytest.mark.django_db
def test_a_project_with_nothing_synced_yet_says_so_instead_of_not_found(make_tenant):
    fresh = make_tenant("nothing-synced")  # a project with no source rows at all
    result = ask("What is the on-call rota?", scope_for_user(fresh.admin))
    assert result.answer.text == EMPTY_SCOPE_NOTE and not result.answer.answered
    assert result.verdict.decided_by == "empty scope"


@pytest.mark.django_db
def test_parallel_tools_run_and_are_reported(kb):
    result = ask("what did Lee say in the billing channel about compute_backoff?", scope_for_user(kb.acme.admin))
    tools = [t["tool"] for t in result.tools_run]
    assert tools == ["search", "search_code", "search_slack"]
    assert all("rows" in t for t in result.tools_run), result.tools_run
    numbers = [e.n for e in result.evidence]
    assert numbers == list(range(1, len(numbers) + 1))
    assert len({e.document_id for e in result.evidence}) == len(result.evidence)


@pytest.mark.django_db
def test_empty_question_is_refused(kb):
    with pytest.raises(EmptyQuery):
        ask("  ", scope_for_user(kb.acme.admin))


def test_citation_validator_drops_numbers_outside_the_evidence():
    from search.pipeline.evidence import Evidence

    ev = [
        Evidence(n=i, document_id=i, kind="doc_section", title="t", url="", text="x", score=0, tool="search")
        for i in (1, 2)
    ]
    text, cited, removed = validate_citations("Deploy with make [2]. Tokens rotate [7]. Both [1, 9].", ev)
    assert text == "Deploy with make [2]. Tokens rotate. Both [1]."
    assert cited == [2, 1]
    assert removed == [7, 9]


@pytest.mark.slow
@pytest.mark.django_db
def test_llm_planner_and_synthesizer_through_a_loopback_server(kb, settings):
    def responder(body):
        if _judge_call(body):
            return '{"answer": "yes"}'
        if body.get("response_format"):
            assert body["response_format"]["type"] == "json_schema"
            return json.dumps({"tools": [{"name": "search", "query": "deploy billing service"}]})
        prompt = body["messages"][-1]["content"]
        assert "[1]" in prompt and "Question: How do I deploy billing?" in prompt
        return "Run make release from the ops repository [1]. It also needs a token [12]."

    with FakeOpenAIServer(responder) as server:
        settings.OPENAI_BASE_URL = server.base_url
        settings.OPENAI_API_KEY = "test"
        settings.KB_LLM_MODEL = "test-model"
        result = ask("How do I deploy billing?", scope_for_user(kb.acme.admin))
    assert result.plan["planner"] == "llm"
    assert result.answer.synthesizer == "llm"
    assert result.answer.text == "Run make release from the ops repository [1]. It also needs a token."
    assert result.answer.removed_citations == [12]
    assert result.answer.cited == [1]
    assert result.evidence[0].title == "Runbook > Deploying the billing service"
    streamed = [r for r in server.requests if r["body"].get("stream")]
    assert len(streamed) == 1


@pytest.mark.django_db
def test_planner_failing_twice_falls_back_to_search(kb, settings):
    calls = {"plan": 0, "rerank": 0}

    def responder(body):
        if _judge_call(body):
            return '{"answer": "yes"}'
        if body["messages"][0]["content"].startswith("You rank search results"):
            calls["rerank"] += 1  # the search tool's reranker: one score per candidate line
            candidates = [line for line in body["messages"][1]["content"].splitlines() if line.startswith("[")]
            return json.dumps({"scores": [5] * len(candidates)})
        if body.get("response_format"):
            calls["plan"] += 1
            if calls["plan"] == 1:
                return "this is not json"
            raise ServerError(500, "model crashed")
        return "Use make release [1]."

    with FakeOpenAIServer(responder) as server:
        settings.OPENAI_BASE_URL = server.base_url
        settings.KB_LLM_MODEL = "test-model"
        result = ask("How do I deploy billing?", scope_for_user(kb.acme.admin))
    assert calls["plan"] == 2 and calls["rerank"] == 1
    assert result.plan["planner"] == "fallback"
    assert result.plan["tools"] == ["search"]
    assert len(result.plan["errors"]) == 2
    assert result.answer.text == "Use make release [1]."


@pytest.mark.django_db
def test_synthesizer_failure_falls_back_to_extractive(kb, settings):
    def responder(body):
        if _judge_call(body):
            return '{"answer": "yes"}'
        if body.get("response_format"):
            return json.dumps({"tools": [{"name": "search", "query": "deploy billing"}]})
        raise ServerError(503, "overloaded")

    with FakeOpenAIServer(responder) as server:
        settings.OPENAI_BASE_URL = server.base_url
        settings.KB_LLM_MODEL = "test-model"
        result = ask("How do I deploy the billing service?", scope_for_user(kb.acme.admin))
    assert result.answer.synthesizer == "extractive"
    assert "503" in result.answer.error or "overloaded" in result.answer.error
    assert result.answer.cited


PARTIAL_QUESTION = "How is the per-request CO2e of the billing service computed with kv_crc?"
# Answerable but for one identifier no source holds: the gate lets it through as partial.
NAMED_MISSING_QUESTION = "How do I deploy the billing service with make release and the kv_crc secret?"


@pytest.mark.django_db
def test_a_question_naming_what_no_source_mentions_is_declined_with_the_missing_terms(kb):
    result = ask(PARTIAL_QUESTION, scope_for_user(kb.acme.admin))
    assert not result.answer.answered
    assert result.verdict.missing_terms == ("CO2e", "kv_crc")
    assert "“CO2e”, “kv_crc”" in result.answer.text or result.answer.text.startswith("The sources I can read")
    covered = ask("How do I deploy the billing service?", scope_for_user(kb.acme.admin))
    assert covered.answer.answered and "do not mention" not in covered.answer.text


@pytest.mark.django_db
def test_llm_is_told_the_missing_terms_and_the_answer_opens_with_the_note(kb, settings):
    plan = json.dumps({"tools": [{"name": "search", "query": "billing CO2e"}]})

    def responder(body):
        if _judge_call(body):
            return '{"answer": "yes"}'
        return plan if body.get("response_format") else "Billing deploys with make release [1]."

    with FakeOpenAIServer(responder) as server:
        settings.OPENAI_BASE_URL, settings.OPENAI_API_KEY, settings.KB_LLM_MODEL = server.base_url, "k", "m"
        result = ask(NAMED_MISSING_QUESTION, scope_for_user(kb.acme.admin))
        prompt = server.requests[-1]["body"]["messages"][-1]["content"]
    assert 'no source mentions "kv_crc"' in prompt, result.verdict
    assert result.verdict.status == "partial" and result.verdict.decided_by == "evidence and llm"
    assert result.answer.synthesizer == "llm" and not result.answer.answered
    assert result.answer.text.startswith("The sources found do not mention “kv_crc”")
    assert result.answer.text.endswith("Billing deploys with make release [1].")


@pytest.mark.django_db
def test_extractive_answer_quotes_statements_not_headings_or_anchor_markup():
    from search.pipeline.evidence import Evidence
    from search.pipeline.extractive import extractive_answer

    page = Evidence(
        n=1,
        document_id=1,
        kind="doc_section",
        title="Cookie Parameters",
        url="",
        score=1.0,
        tool="search",
        text="## Declare Cookie parameters { #declare-cookie-parameters }\n\n"
        "Then declare the cookie parameters using the same structure as with Path { #x }.",
        lexical_rank=1,
    )
    question = "How do I declare cookie parameters?"
    answer = extractive_answer(question, [page], verdict=scored_verdict(question, [page]))
    assert answer.text == "Then declare the cookie parameters using the same structure as with Path [1]."
    assert "{ #" not in answer.text and "Declare Cookie parameters" not in answer.text


@pytest.mark.django_db
def test_extractive_answer_drops_inline_html_tags_but_keeps_their_text():
    from search.pipeline.evidence import Evidence
    from search.pipeline.extractive import extractive_answer

    page = Evidence(
        n=1,
        document_id=1,
        kind="doc_section",
        title="CORS",
        url="",
        score=1.0,
        tool="search",
        text='You can configure <abbr title="Cross-Origin Resource Sharing">CORS</abbr> in your FastAPI application.',
        lexical_rank=1,
    )
    question = "How do I configure CORS?"
    answer = extractive_answer(question, [page], verdict=scored_verdict(question, [page]))
    assert "You can configure CORS in your FastAPI application [1]." in answer.text
    assert "<abbr" not in answer.text and "</abbr" not in answer.text


@pytest.mark.django_db
def test_extractive_answer_names_people_by_their_credit_line_and_code_by_its_signature():
    """A who-knows block is its person and credit line (the name once), not one of its listed
    documents; a code block is quoted with its location and signature."""
    from search.pipeline.evidence import Evidence
    from search.pipeline.extractive import extractive_answer

    person = Evidence(
        n=1,
        document_id=-1,
        kind="person",
        title="Ana Ruiz",
        url="",
        score=3.2,
        tool="who_knows",
        text="Ana Ruiz is credited 3.21 points for this question by 4 documents.\n\nAuthor: commit “Slack export”.",
        lexical_rank=1,
    )
    code = Evidence(
        n=2,
        document_id=2,
        kind="code_chunk",
        title="billing/retry.py: compute_backoff",
        url="",
        score=1.0,
        tool="search",
        text='def compute_backoff(attempt: int) -> float:\n    """Backoff for webhooks."""\n'
        "    return min(300.0, 2 ** attempt)\n",
        path="billing/retry.py",
        start_line=10,
        end_line=13,
        metadata={"symbol": "compute_backoff", "language": "python"},
        lexical_rank=2,
    )
    question = "who knows the slack export connector"
    text = extractive_answer(question, [person], verdict=scored_verdict(question, [person])).text
    assert text == "- Ana Ruiz is credited 3.21 points for this question by 4 documents [1]"
    question = "How is the webhook backoff computed?"
    text = extractive_answer(question, [code], verdict=scored_verdict(question, [code])).text
    assert text.startswith("`compute_backoff` in `billing/retry.py:10-13` [2]:\n```python\ndef compute_backoff(attempt")
    assert "return min(300.0, 2 ** attempt)" in text


@pytest.mark.django_db
def test_a_who_knows_answer_says_what_each_person_did_with_the_documents_found():
    """A person row listing its credited documents is answered by what the person did with the
    first two (authored a commit, committed to a file found), the count of the rest, never by a
    score; a commit that only supports a file credit (credit 0) is not named."""
    from search.pipeline.evidence import Evidence
    from search.pipeline.extractive import extractive_answer

    def document(title, kind, location, role, credit):
        return {"title": title, "kind": kind, "location": location, "role": role, "credit": credit}

    documents = [
        document("Fix Slack export day files", "commit", "commit/abc", "author", 1.0),
        {
            **document("sources/slack.py: parse", "code_chunk", "sources/slack.py:10-40", "file author", 0.5),
            "path": "sources/slack.py",
        },
        document("Slack export", "doc_section", "docs/slack.md", "participant", 0.2),
        document("Reformat everything", "commit", "commit/def", "committed to x", 0.0),
    ]
    person = Evidence(
        n=1,
        document_id=-1,
        kind="person",
        title="Ana Ruiz",
        url="",
        score=1.7,
        tool="who_knows",
        text="Ana Ruiz is credited 1.70 points for this question by 4 documents.",
        metadata={"person": "Ana Ruiz", "documents": documents},
        lexical_rank=1,
    )
    question = "Who knows about the Slack export?"
    text = extractive_answer(question, [person], verdict=scored_verdict(question, [person])).text
    assert text == (
        "- **Ana Ruiz** authored commit “Fix Slack export day files” and committed changes to "
        "`sources/slack.py` (3 documents found) [1]"
    )
    assert "points" not in text and "Reformat" not in text


@pytest.mark.django_db
def test_a_code_answer_from_a_merged_file_block_names_the_chunk_its_lines_come_from():
    """Two chunks of one file share one number (``number_evidence``), the second after a line
    naming its location. A code answer quoting the second chunk's lines is named by that chunk's
    symbol and location and shows neither the merge line nor the first chunk's lines."""
    from search.pipeline.evidence import Evidence, number_evidence
    from search.pipeline.extractive import extractive_answer

    def chunk(document_id, symbol, start, body, rank):
        return Evidence(
            n=0,
            document_id=document_id,
            kind="code_chunk",
            title=f"billing/fusion.py: {symbol}",
            url="",
            score=1.0,
            tool="search",
            text=body,
            path="billing/fusion.py",
            start_line=start,
            end_line=start + body.count("\n") - 1,
            metadata={"symbol": symbol, "language": "python"},
            lexical_rank=rank,
        )

    recency = chunk(1, "recency_ranks", 35, "def recency_ranks(rows):\n    return sorted(rows, key=age)\n", 1)
    fuse = chunk(
        2,
        "reciprocal_rank_fuse",
        15,
        "def reciprocal_rank_fuse(lists, k=60):\n    # reciprocal rank fusion of ranked lists\n"
        "    return sum(1.0 / (k + rank) for rank in lists)\n",
        2,
    )
    (block,) = number_evidence([[recency, fuse]])
    assert "### billing/fusion.py:15-17" in block.text  # how the second chunk joined the block
    question = "Where is reciprocal rank fusion of ranked lists computed?"
    text = extractive_answer(question, [block], verdict=scored_verdict(question, [block])).text
    assert text.startswith("`reciprocal_rank_fuse` in `billing/fusion.py:15-17` [1]:"), text
    assert "def reciprocal_rank_fuse(lists, k=60):" in text
    assert "###" not in text and "recency_ranks" not in text and "sorted(rows" not in text


@pytest.mark.django_db
def test_extractive_answer_shows_the_code_a_sentence_introduces_and_skips_fragments_and_tables():
    from search.pipeline.evidence import Evidence
    from search.pipeline.extractive import extractive_answer

    page = Evidence(
        n=1,
        document_id=1,
        kind="doc_section",
        title="Static Files > Use StaticFiles",
        url="",
        score=1.0,
        tool="search",
        lexical_rank=1,
        text="Mount a folder of static files with StaticFiles like this:\n\n```python\nfrom fastapi.staticfiles "
        'import StaticFiles\napp.mount("/static", StaticFiles(directory="static"), name="static")\n```\n\n'
        "| name | static |\n| directory | static |\n\nSee also:",
    )
    question = "How do I serve static files from a folder?"
    text = extractive_answer(question, [page], verdict=scored_verdict(question, [page])).text
    assert text.startswith("Mount a folder of static files with StaticFiles like this [1]:\n\n```\nfrom fastapi")
    assert 'app.mount("/static"' in text
    assert "| name |" not in text and "See also" not in text


@pytest.mark.django_db
def test_a_sentence_introducing_code_the_evidence_lacks_gives_way_to_the_next_best_sentence():
    """A page that includes its example from another file shows "... like this:" with no code
    after it: that sentence cannot be quoted, so the answer quotes the page's next-best sentence
    instead of declining."""
    from search.pipeline.evidence import Evidence
    from search.pipeline.extractive import extractive_answer

    page = Evidence(
        n=1,
        document_id=1,
        kind="doc_section",
        title="Static Files",
        url="",
        score=1.0,
        tool="search",
        lexical_rank=1,
        text="Serve static files from a folder like this:\n\nThe mounted files keep the names they have on disk.",
    )
    question = "How do I serve static files from a folder?"
    draft = extractive_answer(question, [page], verdict=scored_verdict(question, [page]))
    assert draft.answers and draft.cited == [1], draft.text
    assert draft.text == "The mounted files keep the names they have on disk [1]."


def test_a_chat_line_ending_in_an_emoji_code_introduces_nothing():
    from search.pipeline.extractive import introduces

    assert introduces("Mount the folder like this:")
    assert not introduces("We aim for EU-West-3 go-live by 6/1. paul: :thumbsup:")
    assert not introduces("Deploy with make release.")


@pytest.mark.django_db
def test_when_only_cut_sentences_answer_they_are_quoted_marked_as_cut():
    """An excerpt can cut every sentence that answers; the gate said the evidence answers, so
    the cut sentence is quoted, marked with "…", rather than the answer declining."""
    from search.pipeline.evidence import Evidence
    from search.pipeline.extractive import extractive_answer

    block = Evidence(
        n=1,
        document_id=1,
        kind="doc_section",
        title="Tenancy",
        url="",
        score=1.0,
        tool="search",
        text="a query with no tenant set sees nothing, and an insert for another tenant is refused",
        lexical_rank=1,
    )
    question = "What does a query with no tenant set see?"
    draft = extractive_answer(question, [block], verdict=scored_verdict(question, [block]))
    assert draft.answers
    assert draft.text == "…a query with no tenant set sees nothing, and an insert for another tenant is refused [1]…"


@pytest.mark.parametrize(
    ("markdown", "shown"),
    [
        (r"Set `KB\_SECRETS\_KEY` or call shown\_path [1].", r"Set `KB\_SECRETS\_KEY` or call shown_path [1]."),
        (r"\*args and \[draft\] stay text; C:\\temp too", r"*args and [draft] stay text; C:\temp too"),
        ("```python\nname = r'a\\_b'\n```\nthen my\\_var [2]", "```python\nname = r'a\\_b'\n```\nthen my_var [2]"),
        (r"a backslash before a letter \d stays", r"a backslash before a letter \d stays"),
    ],
)
def test_the_terminal_shows_names_as_written_and_code_as_the_code_says(markdown, shown):
    from search.rendering import answer_terminal_text

    assert answer_terminal_text(markdown) == shown


@pytest.mark.django_db
def test_manage_ask_prints_the_answer_without_markdown_escapes(kb, capsys):
    from django.core.management import call_command

    # The closest sources are listed by title, escaped for Markdown (compute\_backoff).
    call_command(
        "ask", "How much does the backoff of billing retries cost per month in dollars?", "--tenant", "kb-acme"
    )
    out = capsys.readouterr().out
    assert "Closest, not answering" in out and "compute_backoff" in out and "compute\\_backoff" not in out, out


def test_a_closest_source_with_a_long_title_is_cut_at_a_word_with_an_ellipsis():
    """A decline names its closest sources by title; a commit's long subject line is cut at a word
    boundary, marked "…", never mid-word."""
    from search.pipeline.drafts import CLOSEST_TITLE_CHARS, closest_lines, shortened
    from search.pipeline.evidence import Evidence

    subject = "Replay the answer gate over every evaluation set " * 8
    commit = Evidence(n=1, document_id=1, kind="commit", title=subject, url="", text="x", score=1.0, tool="search")
    (line,) = closest_lines([commit])
    title = line.removeprefix("- ")
    assert title.endswith("…") and len(title) <= CLOSEST_TITLE_CHARS
    assert subject.startswith(title[:-1]) and subject[len(title) - 1] == " "  # cut before a space
    assert shortened("short title", 200) == "short title"
    assert shortened("x" * 300, 10) == "x" * 9 + "…"
