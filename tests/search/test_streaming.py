"""The streamed answer: citation validation over token boundaries, the event stream of
``ask_stream`` with the extractive synthesizer and with a loopback LLM streaming tokens."""

import json
import time
import uuid

import pytest

from search.pipeline.evidence import Evidence
from search.pipeline.synthesizer import StreamingCitationFilter, validate_citations
from search.retrieval import EmptyQuery
from search.services import ask_stream
from sources.selectors import scope_for_user
from tests.llm_server import FakeOpenAIServer, ServerError, StreamError


def _stream(pieces: list[str], valid=(1, 2)) -> tuple[list[str], StreamingCitationFilter]:
    citations = StreamingCitationFilter(valid)
    deltas = [citations.feed(p) for p in pieces] + [citations.flush()]
    return deltas, citations


def test_citation_split_across_tokens_is_held_until_it_closes():
    deltas, citations = _stream(["Deploy with make [", "1", "]. Tokens rotate [", "1", "2", "]", "."])
    assert deltas == ["Deploy with make", "", " [1]. Tokens rotate", "", "", "", ".", ""]
    assert citations.text == "Deploy with make [1]. Tokens rotate."
    assert citations.cited == [1]
    assert citations.removed == [12]


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("Deploy with make [2]. Tokens rotate [7]. Both [1, 9].", "Deploy with make [2]. Tokens rotate. Both [1]."),
        ("  a[b] and [x] stay, [ 1] too [1]  \n", "a[b] and [x] stay, [ 1] too [1]"),
        ("nested [[2]] and open [1 [2] end [", "nested [[2]] and open [1 [2] end ["),
        ("[7] leading removed, then [2,1,2]", "leading removed, then [2][1][2]"),
        ("lines\n\nkeep [1]\n- item [3]\n", "lines\n\nkeep [1]\n- item"),
    ],
)
def test_any_token_split_gives_the_whole_text_result(raw, expected):
    ev = [
        Evidence(n=i, document_id=i, kind="doc_section", title="t", url="", text="x", score=0, tool="search")
        for i in (1, 2)
    ]
    assert validate_citations(raw, ev)[0] == expected
    for size in (1, 2, 3, 7):
        deltas, citations = _stream([raw[i : i + size] for i in range(0, len(raw), size)])
        assert "".join(deltas) == expected, size
        # No prefix the reader ever saw holds a refused number.
        shown = ""
        for delta in deltas:
            shown += delta
            assert "[7" not in shown and "[9" not in shown and "[3" not in shown


def _events(question, scope):
    events = list(ask_stream(question, scope))
    for event in events:
        json.dumps(event.data)  # every payload goes on the wire as JSON
    return events


@pytest.mark.django_db
def test_extractive_stream_sends_plan_tools_evidence_tokens_done(kb):
    from kbportal.tenancy import tenant_context
    from search.models import AnswerRecord

    events = _events("How do I deploy the billing service?", scope_for_user(kb.acme.admin))
    types = [e.type for e in events]
    tokens = [e.data["text"] for e in events if e.type == "token"]
    assert types[:3] == ["plan", "tools", "evidence"] and types[-1] == "done"
    assert types[3:-1] == ["token"] * len(tokens) and len(tokens) >= 2
    plan, tools, evidence, done = events[0].data, events[1].data, events[2].data["evidence"], events[-1].data
    assert plan["planner"] == "rules" and plan["tools"] == ["search"]
    assert tools["tools_run"][0]["tool"] == "search" and tools["tools_run"][0]["rows"] >= len(evidence)
    # one number per file: the runbook's two sections share a block
    assert len({e["path"] for e in evidence if e["path"]}) == len([e for e in evidence if e["path"]])
    assert [e["n"] for e in evidence] == list(range(1, len(evidence) + 1))
    assert "".join(tokens) == done["text"]
    assert done["synthesizer"] == "extractive" and done["answered"] and not done["fallback"]
    assert "make release" in done["text"] and "[1]" in done["text"]
    cited = set(done["cited"])
    assert [s["n"] for s in done["sources"]] == [e["n"] for e in evidence if e["n"] in cited]
    assert done["sources"][0]["link"] == "https://wiki.acme.example/runbook#deploy"
    timings = done["timings_ms"]
    assert 0 < timings["first_token"] <= timings["total"]
    with tenant_context(kb.acme.tenant.pk):
        record = AnswerRecord.objects.get(public_id=uuid.UUID(done["answer_id"]))
    assert record.question == "How do I deploy the billing service?"
    assert record.user_id == kb.acme.admin.pk and record.answered and record.answer == done["text"]

    # the cited blocks' rows, the sections merged into them included
    def rows(blocks):
        return [i for b in blocks for i in [b["document_id"], *(x["document_id"] for x in b["sections"])]]

    assert record.cited_document_ids == rows(done["sources"])
    assert record.evidence_document_ids == rows(evidence)
    assert record.first_token_ms == timings["first_token"] and record.latency_ms == timings["total"]


@pytest.mark.django_db
def test_stream_declines_with_no_sources_when_nothing_relevant(kb):
    done = _events("qwxzy vbnmk plorf", scope_for_user(kb.acme.admin))[-1].data
    assert not done["answered"] and done["cited"] == [] and done["sources"] == []


def test_blank_question_is_refused_before_anything_runs():
    from sources.selectors import QueryScope

    scope = QueryScope(
        tenant_id=1, user_id=None, project_id=1, project_slug="p", project_name="P", allowed_source_ids=()
    )
    with pytest.raises(EmptyQuery):
        ask_stream("   ", scope)  # raises at the call, not at the first event


def _use(settings, server):
    settings.OPENAI_BASE_URL = server.base_url
    settings.OPENAI_API_KEY = "test"
    settings.KB_LLM_MODEL = "test-model"


PLAN = json.dumps({"tools": [{"name": "search", "query": "deploy billing service"}]})


@pytest.mark.django_db
def test_llm_tokens_stream_as_they_arrive_and_an_out_of_range_citation_never_reaches_the_client(kb, settings):
    pieces = ["Run make", " release from the ops repository [", "1", "]. It needs a", " token [", "1", "2", "]", "."]

    def responder(body):
        return PLAN if body.get("response_format") else pieces

    received: list[tuple[float, object]] = []
    with FakeOpenAIServer(responder, chunk_delay=0.05) as server:
        _use(settings, server)
        for event in ask_stream("How do I deploy the billing service?", scope_for_user(kb.acme.admin)):
            received.append((time.perf_counter(), event))
    types = [e.type for _, e in received]
    tokens = [e.data["text"] for _, e in received if e.type == "token"]
    done = received[-1][1].data
    assert types[:3] == ["plan", "tools", "evidence"] and types[-1] == "done"
    assert len(tokens) >= 5, tokens
    assert "12" not in "".join(tokens)
    assert "".join(tokens) == done["text"] == "Run make release from the ops repository [1]. It needs a token."
    assert done["synthesizer"] == "llm" and done["answered"]
    assert done["cited"] == [1] and done["removed_citations"] == [12]
    assert [s["n"] for s in done["sources"]] == [1]
    assert done["sources"][0]["title"] == "Runbook > Deploying the billing service"
    # Streamed, not buffered: the first token came while the server was still sending (9 chunks, 50 ms apart).
    first_token_at = next(t for t, e in received if e.type == "token")
    assert received[-1][0] - first_token_at > 0.25
    assert done["timings_ms"]["first_token"] < done["timings_ms"]["total"] - 250


@pytest.mark.django_db
def test_llm_failing_mid_stream_falls_back_to_the_extractive_answer(kb, settings):
    def responder(body):
        if body.get("response_format"):
            return PLAN
        return ["Run make ", "release [1", "]", StreamError("the model crashed")]

    with FakeOpenAIServer(responder) as server:
        _use(settings, server)
        events = _events("How do I deploy the billing service?", scope_for_user(kb.acme.admin))
    tokens = [e.data["text"] for e in events if e.type == "token"]
    done = events[-1].data
    assert "".join(tokens) == "Run make release [1]"  # nothing after the failure
    assert events[-1].type == "done" and done["fallback"]
    assert done["synthesizer"] == "extractive" and done["error"].startswith("the language model failed")
    assert "the model crashed" not in done["error"]  # the provider's text stays in the server log
    assert "make release" in done["text"] and "[1]" in done["text"] and done["answered"]
    assert done["cited"] and {s["n"] for s in done["sources"]} == set(done["cited"])


@pytest.mark.django_db
def test_llm_refusing_before_any_token_streams_the_extractive_answer(kb, settings):
    def responder(body):
        if body.get("response_format"):
            return PLAN
        raise ServerError(503, "overloaded")

    with FakeOpenAIServer(responder) as server:
        _use(settings, server)
        events = _events("How do I deploy the billing service?", scope_for_user(kb.acme.admin))
    tokens = [e.data["text"] for e in events if e.type == "token"]
    done = events[-1].data
    assert done["fallback"] and "HTTP 503" in done["error"]
    assert tokens and "".join(tokens) == done["text"]


@pytest.mark.slow
@pytest.mark.django_db
def test_an_llm_answer_citing_no_evidence_is_replaced_by_the_sources_own_words_or_a_decline(kb, settings):
    """A draft with no [n] is not grounded in the evidence (a small model invents a field name).
    When the gate found the evidence answers the question, the extractive answer (the runbook's
    own sentence, cited) replaces it; when the evidence answers only in part, the answer declines
    and points at the closest sources. A draft that itself says the sources lack the answer is
    kept as written under a partial verdict, and replaced by the sources' words under an answered
    one (the gate and the LLM's judgement decide; check ``declines_answered``)."""
    from search.pipeline.checks import UNCITED_NOTE
    from search.pipeline.gate import JUDGE_PROMPT, text_declines

    drafts = {"answer": ["The field is ", "`build_sequence`", "; increment it by one."]}

    def responder(body):
        if body["messages"][0]["content"] == JUDGE_PROMPT:
            return json.dumps({"answer": "yes"})  # the sufficiency judgement agrees with the gate
        if body.get("response_format"):
            return PLAN
        return drafts["answer"]

    with FakeOpenAIServer(responder) as server:
        _use(settings, server)
        done = _events("How do I deploy the billing service?", scope_for_user(kb.acme.admin))[-1].data
        runbook = next(s["n"] for s in done["sources"] if s["external_id"] == "runbook#deploy")
        assert "build_sequence" not in done["text"] and "make release" in done["text"]
        assert f"[{runbook}]" in done["text"] and done["answered"] is True and done["synthesizer"] == "extractive"
        assert done["fallback"] and "quotes the sources instead" in done["error"] and done["checks"] == ["uncited"]

        partial = "Who approves a deploy of the billing service?"  # the runbook never says: partial
        done = _events(partial, scope_for_user(kb.acme.admin))[-1].data
        assert UNCITED_NOTE in done["text"] and "build_sequence" not in done["text"]
        assert text_declines(done["text"]) and done["answered"] is False
        assert done["fallback"] and "cited none of the evidence" in done["error"]
        assert done["cited"] == [] and done["sources"] == [] and "Closest, not answering:" in done["text"]
        # the list shown beside a decline is the blocks its text names as closest, no more
        named = [line for line in done["text"].splitlines() if line.startswith("- ")]
        assert done["closest"] and len(done["closest"]) == len(named)

        # A draft saying the sources lack the answer: kept as written where the gate found a part
        # missing; where it found them answering, the sources' own words replace it.
        drafts["answer"] = ["The sources do not mention ", "who approves it."]
        done = _events(partial, scope_for_user(kb.acme.admin))[-1].data
        assert done["text"].endswith("The sources do not mention who approves it.") and not done["fallback"]
        assert done["answered"] is False and done["cited"] == []

        drafts["answer"] = ["The sources do not mention ", "how to deploy it."]
        done = _events("How do I deploy the billing service?", scope_for_user(kb.acme.admin))[-1].data
        assert "make release" in done["text"] and "do not mention" not in done["text"]
        assert done["answered"] is True and done["synthesizer"] == "extractive" and done["cited"] == [runbook]
        assert done["fallback"] and done["checks"] == ["declines_answered"]


def _block(n, title, text):
    from search.pipeline.evidence import Evidence

    return Evidence(n=n, document_id=n, kind="doc_section", title=title, url="", text=text, score=0.0, tool="search")


def test_attribution_cites_the_block_holding_what_a_sentence_adds():
    from search.pipeline.checks import attribute_citations

    evidence = [
        _block(1, "On-call", "The on-call rotation changes every Monday at 10:00 in PagerDuty."),
        _block(2, "Deploying billing", "Run make release from the ops repository; it needs the deploy token secret."),
    ]
    question = "How do I deploy billing?"
    text, cited = attribute_citations(
        question,
        "Run make release from the ops repository.\nIt needs the deploy token secret. Ask Priya about quotas.",
        evidence,
    )
    assert text == (
        "Run make release from the ops repository [2].\nIt needs the deploy token secret [2]. Ask Priya about quotas."
    )
    assert cited == [2]
    # Restating the question adds nothing to attribute; words no block holds are not attributed.
    assert attribute_citations(question, "To deploy billing, deploy billing.", evidence) == (
        "To deploy billing, deploy billing.",
        [],
    )
    assert attribute_citations(question, "Use the staging canary with a feature flag.", evidence)[1] == []


def test_invented_names_are_those_no_block_or_question_holds():
    from search.pipeline.checks import invented_names

    evidence = [_block(1, "Deploying billing", "Run `make release`; it needs BILLING_DEPLOY_TOKEN.")]
    answer = "Run `make  release` with `BILLING_DEPLOY_TOKEN` and `build_sequence`, then check retry_count."
    assert invented_names("What does `build_sequence` hold?", answer, evidence) == ["retry_count"]
    assert invented_names("How do I deploy?", answer, evidence) == ["build_sequence", "retry_count"]


def test_an_escaped_backtick_in_a_quoted_title_opens_no_code_name():
    """A title quoted with its backticks escaped (Markdown text, "Update \\`docs/x.md\\`") is
    text, not a code span: only real spans are looked for."""
    from search.pipeline.checks import invented_names

    evidence = [_block(1, "Docs", "Update includes in `docs/tutorial/jwt.md`.")]
    answer = "Ana authored commit “Update includes in \\`docs/tutorial/jwt.md\\` (\\#12)” and changed `docs/a.md` [1]."
    assert invented_names("Who knows the JWT docs?", answer, evidence) == ["docs/a.md"]


def test_names_an_answer_code_example_defines_are_not_invented_but_names_it_uses_are():
    """An LLM's illustrative code defines its own function, variable and path-parameter names
    (and may use an RFC 2606 example URL): those claim nothing about the sources. A parameter
    it passes, or a name its prose states, still has to be in the evidence."""
    from search.pipeline.checks import invented_names

    evidence = [_block(1, "Handling errors", "Raise `HTTPException` with a `detail`.")]
    answer = (
        "Raise `HTTPException` [1], e.g. from `read_item` at `http://example.com/items/foo`:\n\n"
        '```python\n@app.get("/items/{item_id}")\nasync def read_item(item_id: str):\n'
        '    message = "no"\n    raise HTTPException(retry_after=5, detail=message)\n```\n'
        "Set `error_budget` in settings."
    )
    assert invented_names("How do I return an error?", answer, evidence) == ["retry_after", "error_budget"]
    unfenced = answer.replace("```python", "").replace("```", "")
    assert "read_item" in invented_names("How?", unfenced, evidence)


def test_strings_and_objects_an_answer_code_example_writes_are_its_illustration():
    """A route, a header name or a method called on the example's own object claims nothing the
    sources must hold; a method the sources never name still does."""
    from search.pipeline.checks import invented_names

    evidence = [_block(1, "Routers", "Use `include_router` to add a router's routes with a `prefix`.")]
    answer = (
        'Call `app.include_router()` with a prefix; the header `["x-trace-id"]` is set on `"/login"`:\n\n'
        '```python\napp = FastAPI()\napp.include_router(users, prefix="/api")\n'
        '@app.get("/login")\ndef login(response):\n    response.headers["x-trace-id"] = "1"\n'
        "    app.warm_cache()\n```\nThen `app.warm_cache()` runs."
    )
    invented = invented_names("How do I add a router?", answer, evidence)
    assert "app.warm_cache()" in invented and "warm_cache" in invented
    assert not {"app.include_router()", '["x-trace-id"]', '"/login"', "x-trace-id", "/login"} & set(invented)


def test_a_slack_channel_the_evidence_does_not_name_is_invented():
    """A small model named "#incident-bot" as a component's owner channel; the sources say
    "incident-bot" (a bot), never that channel."""
    from search.pipeline.checks import invented_names

    thread = _block(1, "Streaming outage", "The incident-bot drafted the status update.")
    thread.metadata = {"channel": "incidents"}
    answer = "Ask in #incident-bot [1] or #Incidents [1]; see issue #4521 and PR#12 (C#-style &#39;)."
    assert invented_names("Which channel owns it?", answer, [thread]) == ["#incident-bot"]


@pytest.mark.slow
@pytest.mark.django_db
def test_an_uncited_draft_the_evidence_supports_gets_citations_and_an_invented_name_is_flagged(kb, settings):
    """A small model often answers from the evidence without writing [n]: its supported sentences
    are cited to the block holding their words. A cited answer naming a field no block holds is
    replaced by the sources' own words when the evidence answers the question; when it answers
    only in part, the draft opens with a note saying the sources do not mention the field, and
    counts as declined."""
    from search.pipeline.gate import text_declines

    drafts = {"answer": ["Run make release from the ops ", "repository. It needs the BILLING_DEPLOY_TOKEN secret."]}

    def responder(body):
        return PLAN if body.get("response_format") else drafts["answer"]

    with FakeOpenAIServer(responder) as server:
        _use(settings, server)
        done = _events("How do I deploy the billing service?", scope_for_user(kb.acme.admin))[-1].data
        runbook = next(s["n"] for s in done["sources"] if s["external_id"] == "runbook#deploy")
        assert done["text"] == (
            f"Run make release from the ops repository [{runbook}]. "
            f"It needs the BILLING_DEPLOY_TOKEN secret [{runbook}]."
        )
        assert done["cited"] == [runbook] and done["answered"] is True
        assert done["fallback"] and "attributed" in done["error"]

        drafts["answer"] = [f"Run make release [{runbook}]. Set `billing_deploy_key` first [{runbook}]."]
        done = _events("How do I deploy the billing service?", scope_for_user(kb.acme.admin))[-1].data
        assert "billing_deploy_key" not in done["text"] and "BILLING\\_DEPLOY\\_TOKEN" in done["text"]
        assert done["answered"] is True and done["cited"] == [runbook] and done["synthesizer"] == "extractive"
        assert done["checks"] == ["unsupported_names"] and "quotes the sources instead" in done["error"]

        # Evidence answering only in part: the draft stays, opening with the note, and declines.
        done = _events("Who approves a deploy of the billing service?", scope_for_user(kb.acme.admin))[-1].data
        assert "The sources do not mention “billing_deploy_key”" in done["text"]
        assert text_declines(done["text"]) and done["answered"] is False and done["cited"] == [runbook]


@pytest.mark.slow
@pytest.mark.django_db
def test_an_llm_answer_stating_no_value_of_the_asked_form_is_flagged(kb, settings):
    """The question asks for a Slack channel and the evidence holds one (the #billing thread),
    but the model answers with a team: a note says the answer states no channel, and it counts as
    declined. An answer naming the channel stands."""
    from search.pipeline.answer_types import unstated_type_note
    from search.pipeline.gate import text_declines

    drafts = {"answer": ""}
    question = "Which Slack channel discussed invoices stuck in pending after the webhook outage?"

    def responder(body):
        return PLAN if body.get("response_format") else [drafts["answer"]]

    with FakeOpenAIServer(responder) as server:
        _use(settings, server)
        scope = scope_for_user(kb.acme.admin)
        evidence = _events(question, scope)[2].data["evidence"]
        thread = next(e["n"] for e in evidence if e["title"].startswith("#billing"))

        drafts["answer"] = f"The payments team discussed it [{thread}]."
        done = _events(question, scope)[-1].data
        assert done["text"].startswith(unstated_type_note("Slack channel"))
        assert text_declines(done["text"]) and done["answered"] is False
        assert "states no Slack channel" in done["error"]

        drafts["answer"] = f"It was discussed in #billing [{thread}]."
        done = _events(question, scope)[-1].data
        assert done["text"] == drafts["answer"] and done["answered"] is True and not done["error"]

        # The right channel cited to a block that does not hold it: the citation does not support it.
        other = next(e["n"] for e in evidence if e["n"] != thread)
        drafts["answer"] = f"It was discussed in #billing [{other}]."
        done = _events(question, scope)[-1].data
        assert done["text"].startswith("The cited sources do not state “#billing”, the Slack channel this answer")
        assert text_declines(done["text"]) and done["answered"] is False
        assert "its cited sources lack" in done["error"]


def test_ungrounded_values_are_asked_values_no_cited_block_holds():
    from search.pipeline.checks import ungrounded_values

    thread = _block(1, "Streaming outage", "Escalate in #support-escalations; the bot posts to #incidents.")
    adr = _block(2, "ADR-014", "The registry lives in the observability-pack repository.")
    question = "Which Slack channel owns the streaming component?"
    assert ungrounded_values(question, "It is #support [2].", [thread, adr], [2]) == ["#support"]
    assert ungrounded_values(question, "It is #support [1].", [thread, adr], [1]) == ["#support"]  # not whole
    assert ungrounded_values(question, "It is #incidents [1].", [thread, adr], [1]) == []
    # A count is worked out across sources, not copied from one: never checked this way.
    assert ungrounded_values("How many writeups mention it?", "Four [2].", [thread, adr], [2]) == []
