"""The answerability gate: decided from the retrieved evidence, never from the tenant's vocabulary."""

import dataclasses
import json
import time

import pytest

from search.pipeline.answer_types import (
    ANSWER_TYPES,
    COUNT_OF_THINGS,
    asked_answer_type,
    missing_focus_note,
    missing_type_note,
    question_focus,
    unstated_type_note,
)
from search.pipeline.drafts import still_open_note
from search.pipeline.evidence import Evidence
from search.pipeline.extractive import extractive_answer, said_key
from search.pipeline.gate import (
    ANSWERED,
    NOT_FOUND,
    PARTIAL,
    Verdict,
    agent_noun,
    answerability_features,
    answered_probability,
    asked_weights,
    judge,
    missing_focus,
    missing_specific_terms,
    missing_terms_note,
    named_terms,
    score_question_evidence,
    text_declines,
)
from search.pipeline.passages import ScoredEvidence, block_passages, question_weights, score_evidence
from search.pipeline.verbs import object_question_verb
from sources.selectors import scope_for_user
from tests.llm_server import FakeOpenAIServer


def _block(n, title, text, *, kind="doc_section", lexical_rank=None, similarity=None, dense_rank=None, **kw):
    return Evidence(
        n=n,
        document_id=n,
        kind=kind,
        title=title,
        url="",
        text=text,
        score=1.0,
        tool="search",
        lexical_rank=lexical_rank,
        similarity=similarity,
        dense_rank=dense_rank,
        **kw,
    )


def _credited_person_and_commit() -> tuple[Evidence, Evidence]:
    """A commit about the billing deploy ([2]) and the who_knows person block its author earns
    from it ([1])."""
    commit = _block(
        2,
        "Billing deploy: release from the ops repository with make release",
        "Deploying the billing service runs make release from the ops repository; a deploy takes ten minutes.",
        kind="commit",
        lexical_rank=1,
        dense_rank=1,
        similarity=0.7,
    )
    person = Evidence(
        n=1,
        document_id=-1,
        kind="person",
        title="Ana Ruiz",
        url="",
        text="Ana Ruiz wrote or took part in 1 of the documents found for this question (credit score 1.00).",
        score=1.0,
        tool="who_knows",
        lexical_rank=1,
        similarity=0.7,
        metadata={"documents": [{"document_id": 2, "title": commit.title, "role": "author", "credit": 1.0}]},
    )
    return person, commit


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


def test_the_notes_read_as_declines():
    assert text_declines(missing_terms_note(["CO2e", "kv_crc"]))
    assert "“CO2e”" in missing_terms_note(["CO2e", "kv_crc"])
    assert text_declines(missing_type_note("Slack channel"))
    assert text_declines(unstated_type_note("number"))


def test_a_term_no_row_holds_weighs_most_and_a_compound_gives_way_to_its_parts():
    weights = question_weights(
        frozenset({"wifi", "password", "built-in", "built"}), {"password": 40, "built": 400}, 1000
    )
    assert weights["wifi"] == pytest.approx(1.0)
    assert weights["wifi"] > weights["password"] > weights["built"]
    assert "built-in" not in weights  # "built in" in a text still holds its part


def test_the_model_rises_with_coverage_and_similarity_and_falls_with_a_missing_rare_term():
    base = {"coverage": 0.5, "similarity": 0.5, "missing": 0.5, "agreement": 0.2, "margin": 0.2}
    p = answered_probability(base)
    assert answered_probability({**base, "coverage": 0.9}) > p
    assert answered_probability({**base, "similarity": 0.8}) > p
    assert answered_probability({**base, "missing": 1.0}) < p
    assert answered_probability({**base, "margin": 0.4}) > p


def test_features_read_the_best_block_and_its_missing_terms():
    scored = ScoredEvidence(weights={"deploy": 0.5, "billing": 0.6, "wifi": 1.0})
    scored.block_lexemes = {1: frozenset({"deploy", "billing"}), 2: frozenset({"billing"})}
    scored.block_coverage = {
        1: scored.coverage_of(scored.block_lexemes[1]),
        2: scored.coverage_of(scored.block_lexemes[2]),
    }
    evidence = [
        _block(1, "Runbook", "deploy billing", lexical_rank=1, dense_rank=2, similarity=0.6),
        _block(2, "Other", "billing", lexical_rank=2, dense_rank=9, similarity=0.4),
    ]
    features = answerability_features(scored, evidence)
    assert features["coverage"] == pytest.approx(1.1 / 2.1)
    assert features["missing"] == pytest.approx(1.0)  # "wifi", which the best block lacks
    assert features["agreement"] == pytest.approx(0.5)  # both rankers within their top 2
    assert features["similarity"] == pytest.approx(0.6)


def test_terms_only_the_sentences_that_ask_nothing_hold_weigh_half():
    """The asker's situation ("Our ingress strips the prefix") is told in the asker's words; the
    asking sentence's terms weigh in full, the others at CONTEXT_TERM_WEIGHT, in coverage and
    missing alike."""
    weights = {"ingress": 1.0, "strip": 0.6, "configur": 0.5, "prefix": 0.6}
    scored = ScoredEvidence(weights=weights, asked_lexemes=frozenset({"configur", "prefix"}))
    scored.block_lexemes = {1: frozenset({"configur", "prefix"})}
    assert asked_weights(scored) == {"ingress": 0.5, "strip": 0.3, "configur": 0.5, "prefix": 0.6}
    features = answerability_features(scored, [_block(1, "Behind a proxy", "configure the prefix")])
    assert features["coverage"] == pytest.approx(1.1 / 1.9)  # 1.1 / 2.7 with every term in full
    assert features["missing"] == pytest.approx(0.5)  # "ingress", at half its weight
    scored.asked_lexemes = frozenset()  # clauses not scored: every term in full
    assert asked_weights(scored) == weights


@pytest.mark.django_db
def test_the_asked_lexemes_are_those_of_the_sentences_that_ask():
    question = "Our ingress strips the prefix before forwarding. Which setting do I configure?"
    scored = score_evidence(question, [_block(1, "Proxies", "Set root_path.")], df={}, n_rows=10)
    assert {"set", "configur"} <= scored.asked_lexemes and not {"ingress", "strip"} & scored.asked_lexemes
    whole = score_evidence("Which setting do I configure?", [_block(1, "Proxies", "Set root_path.")], df={}, n_rows=10)
    assert asked_weights(whole) == whole.weights
    # a clause past the ones scored on their own (MAX_CLAUSES) still asks
    many = "Who approved the cache? Which team owns it? When did it ship? Where is the runbook stored?"
    scored = score_evidence(many, [_block(1, "Cache", "The cache shipped.")], df={}, n_rows=10)
    assert len(scored.clauses) < 4 and "runbook" in scored.asked_lexemes


def test_passages_keep_headings_apart_and_skip_diagrams():
    text = "## Install { #install }\n\nRun pip install kb. Then start it.\n\n```mermaid\nA->>B: hi\n```\n"
    page = _block(1, "Guide", text + "```python\nimport kb\nkb.start()\n```")
    passages = block_passages(page)
    assert [p.text for p in passages if p.heading] == ["Install"]
    assert any(p.code and "kb.start()" in p.text for p in passages)
    assert not any("A->>B" in p.text for p in passages)


@pytest.mark.django_db
def test_an_answerable_question_is_answered(kb):
    from search.services import ask

    result = ask("How do I deploy the billing service?", scope_for_user(kb.acme.admin))
    assert result.verdict.status == ANSWERED, result.verdict
    assert result.answer.answered


@pytest.mark.django_db
@pytest.mark.parametrize(
    "question",
    [
        "What is our parental leave policy?",  # shares "policy" with the vacation page, nothing else
        "What is the guest wifi password in the Berlin office?",
    ],
)
def test_a_question_the_evidence_does_not_answer_is_declined_even_when_words_exist(kb, question):
    from search.services import ask

    result = ask(question, scope_for_user(kb.acme.admin))
    assert result.verdict.status == NOT_FOUND, result.verdict
    assert not result.answer.answered and result.answer.cited == []
    assert result.answer.text.startswith(("The sources I can read do not answer this.", "I could not find"))
    assert "Closest, not answering:" in result.answer.text or "could not find" in result.answer.text


@pytest.mark.django_db
def test_a_named_identifier_the_evidence_lacks_makes_the_answer_partial_or_not_found(kb):
    from search.services import ask

    result = ask(
        "How is the per-request CO2e of the billing service computed with kv_crc?", scope_for_user(kb.acme.admin)
    )
    assert result.verdict.status in (PARTIAL, NOT_FOUND)
    assert result.verdict.missing_terms == ("CO2e", "kv_crc")
    assert not result.answer.answered
    if result.verdict.status == PARTIAL:
        assert result.answer.text.startswith("The sources found do not mention “CO2e”, “kv_crc”")


@pytest.mark.parametrize(
    ("question", "names"),
    [
        ("What is ZEBRA-4471, and does it need HTTP/3?", ["ZEBRA-4471", "HTTP/3"]),
        ("Which PR changed how POST bodies are read?", []),  # words in capitals are words of the trade
        ('Why does the kiosk show "Card read error"?', ["Card read error"]),  # a quoted message stays whole
        ('With `make_client(base_url="x", retry_ms=5)`, what happens?', ["make_client", "base_url", "retry_ms"]),
        ("If a proxy sends `Accept: text/html;q=0`, what then?", ["Accept", "text"]),  # each name, not the line
        ('What does `Depends(use_cache=True, scope="session")` do?', ["Depends", "use_cache", "scope", "session"]),
        ("What does the lifespan WAL mode do?", ["WAL"]),  # an acronym of its own is a name
        ('Why do I get "Connection refused." errors?', ["Connection refused"]),
        # an example the asker gives is no name the sources must hold; a comparison or a wish names it
        ("Are headers with underscores (like x_token) refused by convert_underscores?", ["convert_underscores"]),
        ("Does the fallback serve paths such as /users/john.doe?", []),
        ("The log looks like ERR-4471 again: what is it?", ["ERR-4471"]),
        ("I'd like max_retry_ms explained.", ["max_retry_ms"]),
        # an issue or pull request reference names one item; a Slack channel is a name in words
        ("What limit did PR #16062 set for lru_cache?", ["lru_cache", "#16062"]),
        ("Why was it posted in #ops and &#39;?", []),
        ("What is the #1 cause of churn, and our #12 priority?", []),  # a rank names no issue
    ],
)
def test_named_terms_are_what_the_evidence_must_hold_as_written(question, names):
    assert named_terms(question) == names


def test_missing_specific_terms_read_only_relevant_blocks():
    evidence = [
        _block(1, "Runbook", "ZEBRA-4471 is the deploy ticket", lexical_rank=1),
        _block(2, "Noise", "PANGOLIN-6402 lives here"),
    ]  # the second not relevant: not ranked, no similarity
    assert missing_specific_terms("What are ZEBRA-4471 and PANGOLIN-6402?", evidence) == ("PANGOLIN-6402",)
    # an issue reference is held by its number, as a commit subject or a link writes it
    merged = [_block(1, "Bump the cache size (#16062)", "pull/16062 raised it", lexical_rank=1)]
    assert missing_specific_terms("What did PR #16062 change?", merged) == ()
    assert missing_specific_terms("What did PR #16063 change?", merged) == ("#16063",)


@pytest.mark.django_db
def test_the_gate_reads_only_what_the_asker_may_read(kb):
    """The restricted HR page is evidence for the admin only; for the member the question is not
    answered and no note or source names the page."""
    from search.services import ask

    question = "What are the quokka salary bands for staff engineers?"
    admin = ask(question, scope_for_user(kb.acme.admin))
    member = ask(question, scope_for_user(kb.acme_member))
    assert any("Salary bands" in e.title for e in admin.evidence)
    assert not any("Salary bands" in e.title for e in member.evidence)
    assert kb.private_marker not in member.answer.text
    assert not member.answer.answered


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
        ("When we use the GPU firmware operator, what BIOS settings are included?", None),
        ("Who approves terminating test instances?", None),
        ("What is the channel strategy for partners?", None),  # "channel strategy" is not a Slack channel
        ("When was the gizmo warranty introduced?", "date"),
        ("When is a dependency with yield run?", None),  # a condition, not a point in time
        ("How long are audit logs kept?", "number"),  # a duration
        ("How long does a rebuild take?", "number"),
        ("How long?", "number"),
        ("What broke after the release that changed how long prompts were handled?", None),  # "long prompts"
        ("What is the maximum number of streams per key?", "number"),
        ("What percentage of requests stalled?", "number"),
        ("What is the number one cause of stalls?", None),
        ("What is the retry budget, in requests per second, of the SDK?", "number"),  # the unit named
        ("How do I get an answer in seconds?", None),
        ("What phone number reaches the front desk?", "phone number"),
        ("Which pager rota covers weekends?", None),
        ("What's the minimum pytest version the tutorial needs?", "version"),  # "what's" and a determiner
        ("What is the Python version of the worker image?", "version"),
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
        ("phone number", "Call the desk on +1 (555) 010-4477 [1].", True),
        ("phone number", "The desk opened 2024-03-02 09:15, ticket 12345 [1].", False),
        ("phone number", "Rotation 11-05 to 11-11, then 10 20 30 [1].", False),
        ("phone number", "Front desk: 555-0100 [1].", True),
        # a chat transcript stamps each message with a date and a time: neither is a count
        ("number", "2024-03-02 09:15 Ana: the export job is stuck again", False),
        ("number", "Posted 2024-03-02T09:15:00Z, answered at 10:30 am on March 1st, 2024.", False),
        ("number", "2024-03-02 09:15 Ana: three exports are stuck", True),
        ("version", "March 1 was when the proxy changed [1].", False),
        ("version", "On 4 June 2024 the proxy was upgraded.", False),
        ("version", "The proxy needs Python 3 [1].", True),
        # a link's or an address's digits are no release
        ("version", "Open http://127.0.0.1:9999/api/v1/app in the browser [1].", False),
        ("version", "The proxy listens on 10.0.0.12 [1].", False),
    ],
)
def test_a_value_of_the_asked_form_is_found_outside_citations(label, text, held):
    kind = next(t for t in ANSWER_TYPES if t.label == label)
    assert kind.held_by(text) is held


def test_a_dotted_version_after_the_word_version_is_one_value():
    version = next(t for t in ANSWER_TYPES if t.label == "version")
    assert version.values("Upgrade to version 2.2.3 now.") == ["version 2.2.3"]


def test_a_transcripts_passages_are_its_messages_each_a_statement_as_written():
    """Chat seldom ends a message with a full stop: a message from its time stamp on is whole,
    a piece the excerpt cut inside a message is not, and continuation lines stay with their message."""
    text = (
        "2024-03-02 09:15 Ana: the nightly export is stuck on the orders table\n"
        "2024-03-02 09:20 Bo: restart the export worker with `kb export --resume`\n"
        "  then check the queue depth … it picked up the backlog after the restart"
    )
    passages = block_passages(_block(1, "#data-eng: export stuck", text, kind="thread"))
    assert [p.text[:21] for p in passages[:2]] == ["2024-03-02 09:15 Ana:", "2024-03-02 09:20 Bo: "]
    assert "then check the queue depth" in passages[1].text
    assert [p.whole for p in passages] == [True, True, False]
    # a transcript written without time stamps: each author's line is one message
    plain = block_passages(_block(2, "#data-eng", "ana: the export is stuck\n\nbo: restart the worker", kind="thread"))
    assert [(p.text, p.whole) for p in plain] == [("ana: the export is stuck", True), ("bo: restart the worker", True)]


@pytest.mark.django_db
def test_the_extractive_answer_quotes_the_thread_that_answers_not_a_whole_sentence_elsewhere(kb):
    """A thread answering the question is quoted though its messages have no full stop; a whole
    sentence of a page the question barely touches is not preferred to it."""
    scope = scope_for_user(kb.acme.admin)
    question = "How do I unstick the nightly export of the orders table?"
    thread = _block(
        1,
        "#data-eng: nightly export stuck",
        "2024-03-02 09:15 Ana: the nightly export of the orders table is stuck again\n"
        "2024-03-02 09:20 Bo: to unstick the nightly export, restart the export worker with "
        "`kb export --resume`",
        kind="thread",
        lexical_rank=1,
        dense_rank=1,
        similarity=0.8,
    )
    page = _block(
        2,
        "Office guide > Kitchen",
        "The kitchen is cleaned every night by the facilities team.",
        lexical_rank=2,
        dense_rank=2,
        similarity=0.3,
    )
    verdict = judge(question, [thread, page], scope)
    answer = extractive_answer(question, [thread, page], verdict=verdict)
    assert answer.answers and "kb export --resume" in answer.text
    assert "kitchen" not in answer.text.lower()


@pytest.mark.django_db
def test_a_count_question_over_a_chat_thread_needs_a_count_not_its_time_stamps(kb):
    """Every transcript line carries a date and a time; a question asking how many is not answered
    by them: the verdict declines until a message states a number."""
    scope = scope_for_user(kb.acme.admin)
    question = "How many orders did the stuck nightly export skip?"
    text = (
        "2024-03-02 09:15 Ana: the nightly export skipped orders again\n"
        "2024-03-02 09:20 Bo: the stuck nightly export skipped the orders table, restarting it"
    )
    thread = _block(
        1, "#data-eng: nightly export skipped orders", text, kind="thread", lexical_rank=1, dense_rank=1, similarity=0.8
    )
    verdict = judge(question, [thread], scope)
    assert verdict.missing_type == "number" and verdict.declines
    counted = _block(
        1,
        thread.title,
        text + "\n2024-03-02 09:30 Ana: it skipped 412 orders",
        kind="thread",
        lexical_rank=1,
        dense_rank=1,
        similarity=0.8,
    )
    assert judge(question, [counted], scope).missing_type == ""


@pytest.mark.django_db
def test_evidence_with_no_value_of_the_asked_form_cannot_answer(kb):
    """A question asking which Slack channel owns something, over sources listing owner teams: the
    verdict is at best partial and the answer a decline; evidence naming a channel (or a thread
    from that channel) lifts it."""
    scope = scope_for_user(kb.acme.admin)
    question = "Which Slack channel owns deploying the billing service?"
    teams = [
        _block(
            1,
            "Runbook > Deploying",
            "To deploy the billing service run make release; owner: Payments team.",
            lexical_rank=1,
            dense_rank=1,
            similarity=0.7,
        )
    ]
    verdict = judge(question, teams, scope)
    assert verdict.missing_type == "Slack channel" and verdict.declines
    answer = extractive_answer(question, teams, verdict=verdict)
    assert not answer.answers or answer.text.startswith(missing_type_note("Slack channel"))

    channel = [
        *teams,
        _block(
            2,
            "Deploys",
            "Deploy questions about billing go to #billing-ops before release.",
            lexical_rank=2,
            dense_rank=2,
            similarity=0.6,
        ),
    ]
    assert judge(question, channel, scope).missing_type == ""
    thread = _block(3, "Deploy day", "Ana: release is out, billing looks fine.", lexical_rank=3)
    thread.metadata = {"channel": "billing-ops"}
    assert judge(question, [*teams, thread], scope).missing_type == ""


@pytest.mark.django_db
def test_a_value_of_the_asked_form_must_be_where_the_question_is_answered(kb):
    """The version another ticket states is no answer to this one: the value must appear in the
    passages that hold the question's terms (or next to them), not anywhere in the evidence."""
    scope = scope_for_user(kb.acme.admin)
    question = "Which firmware version fixed the badge reader errors?"
    ticket = _block(
        1,
        "Badge reader errors",
        "Badge reader errors started after a firmware push to the readers. "
        "The fix rolled back the reader certificate; facilities rebooted the controllers.",
        lexical_rank=1,
        dense_rank=1,
        similarity=0.7,
    )
    other = _block(
        2,
        "SDK upgrade",
        "Customers on the Python SDK should move to v1.8.4 for the retry fix.",
        lexical_rank=2,
        dense_rank=2,
        similarity=0.4,
    )
    verdict = judge(question, [ticket, other], scope)
    assert verdict.missing_type == "version" and verdict.declines
    stated = _block(
        1,
        ticket.title,
        ticket.text + " Firmware 4.2.1 was rolled out to the readers as the fix.",
        lexical_rank=1,
        dense_rank=1,
        similarity=0.7,
    )
    assert judge(question, [stated, other], scope).missing_type == ""


@pytest.mark.django_db
def test_the_extractive_answer_quotes_a_sentence_two_pages_share_once(kb):
    scope = scope_for_user(kb.acme.admin)
    question = "How do I rotate the signing key of the billing service?"
    said = "To rotate the signing key of the billing service, run make rotate-key and restart the workers."
    blocks = [
        _block(1, "Billing runbook > Keys", said, lexical_rank=1, dense_rank=1, similarity=0.8),
        _block(2, "Billing runbook copy > Keys", said, lexical_rank=2, dense_rank=2, similarity=0.8),
    ]
    answer = extractive_answer(question, blocks, verdict=judge(question, blocks, scope))
    assert answer.answers and answer.text.count("make rotate-key") == 1


def test_a_commit_subject_and_the_release_note_copying_it_say_one_thing():
    subject = "🐛 Fix frontend fallback for dotted paths like `/users/john.doe` (#16011)"
    note = "🐛 Fix frontend fallback for dotted paths like `/users/john.doe`."
    assert said_key(subject) == said_key(note) == said_key(subject + ".")
    assert said_key("Restart the workers.") != said_key("Restart the workers twice.")
    assert said_key("Restart the workers?") != said_key("Restart the workers.")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("reply", "decided_by", "status"),
    [
        ('{"answer": "no"}', "evidence and llm", NOT_FOUND),  # the LLM's "no" declines what the model allowed
        ('{"answer": "yes"}', "evidence and llm", ANSWERED),
        ("the evidence looks fine to me", "evidence", ANSWERED),  # not JSON: the model decides
    ],
)
def test_the_llm_sufficiency_judgement_can_decline_and_falls_back_to_the_model(kb, settings, reply, decided_by, status):
    scope = scope_for_user(kb.acme.admin)
    question = "How do I deploy the billing service?"
    evidence = [
        _block(
            1,
            "Runbook > Deploying the billing service",
            "To deploy the billing service run make release from the ops repository.",
            lexical_rank=1,
            dense_rank=1,
            similarity=0.8,
        )
    ]
    with FakeOpenAIServer(lambda body: reply) as server:
        settings.OPENAI_BASE_URL, settings.KB_LLM_MODEL = server.base_url, "m"
        verdict = judge(question, evidence, scope)
        request = server.requests[-1]["body"]
    assert verdict.decided_by == decided_by and verdict.status == status
    assert request["response_format"] == {"type": "json_object"}
    assert "Question: How do I deploy the billing service?" in request["messages"][-1]["content"]
    assert json.dumps(request["messages"][0]["content"])  # the system prompt is sent


@pytest.mark.django_db
def test_the_llm_is_not_asked_whether_passages_state_who_knows_what_the_who_knows_tool_credits(kb, settings):
    """The people credited are the answer to "who knows X", which no passage states: an LLM
    asked whether the passages say it would decline every such question."""
    person, commit = _credited_person_and_commit()
    with FakeOpenAIServer(lambda body: '{"answer": "no"}') as server:
        settings.OPENAI_BASE_URL, settings.KB_LLM_MODEL = server.base_url, "m"
        verdict = judge("Who knows about the billing deploy?", [person, commit], scope_for_user(kb.acme.admin))
        assert server.requests == []
    assert verdict.status == ANSWERED and verdict.decided_by == "evidence"


@pytest.mark.django_db
def test_an_llm_answer_to_who_knows_that_names_no_one_credited_gives_way_to_the_people(kb):
    """An LLM draft answering "who can I ask about X" with where X is documented names none of
    the people credited: the extractive answer, naming them, replaces it; a draft naming one
    stands."""
    from search.pipeline.checks import check_answer
    from search.pipeline.drafts import Draft

    person, commit = _credited_person_and_commit()
    question = "Who can I ask about the billing deploy?"
    verdict = judge(question, [person, commit], scope_for_user(kb.acme.admin))
    assert verdict.status == ANSWERED, verdict
    elsewhere = Draft(
        text="The billing deploy is described in the ops runbook [2].", cited=[2], synthesizer="llm", answers=True
    )
    answer = check_answer(question, [person, commit], verdict, elsewhere)
    assert answer.answered and "names_no_person" in answer.checks, answer
    assert answer.text.startswith("- **Ana Ruiz** wrote document") and answer.synthesizer == "extractive"
    named = Draft(
        text="Ask Ana Ruiz, who wrote the billing deploy commit [1][2].", cited=[1, 2], synthesizer="llm", answers=True
    )
    answer = check_answer(question, [person, commit], verdict, named)
    assert answer.answered and answer.checks == [] and answer.text == named.text


@pytest.mark.django_db
def test_the_llm_is_not_asked_when_the_evidence_model_already_declines(kb, settings):
    evidence = [
        _block(
            1,
            "Handbook > Vacation policy",
            "Employees get twenty-five days of paid vacation per year.",
            lexical_rank=1,
            dense_rank=1,
            similarity=0.2,
        )
    ]
    with FakeOpenAIServer(lambda body: '{"answer": "yes"}') as server:
        settings.OPENAI_BASE_URL, settings.KB_LLM_MODEL = server.base_url, "m"
        question = "What is the guest wifi password in the Berlin office?"
        verdict = judge(question, evidence, scope_for_user(kb.acme.admin))
        assert server.requests == []
    assert verdict.status == NOT_FOUND and verdict.decided_by == "evidence"


@pytest.mark.django_db
def test_a_slow_sufficiency_judgement_is_abandoned_for_the_model(kb, settings):
    import time

    def slow(body):
        time.sleep(1.5)
        return '{"answer": "no"}'

    evidence = [
        _block(
            1,
            "Runbook > Deploying the billing service",
            "To deploy the billing service run make release.",
            lexical_rank=1,
            dense_rank=1,
            similarity=0.8,
        )
    ]
    with FakeOpenAIServer(slow) as server:
        settings.OPENAI_BASE_URL, settings.KB_LLM_MODEL, settings.KB_LLM_JUDGE_TIMEOUT = server.base_url, "m", 0.3
        verdict = judge("How do I deploy the billing service?", evidence, scope_for_user(kb.acme.admin))
    # Waited for, the judge's "no" would have declined ("evidence and llm"): the model decided alone.
    # (No wall-clock bound: on a loaded machine the gate's own work can take longer than the reply.)
    assert verdict.decided_by == "evidence" and verdict.status == ANSWERED


@pytest.mark.parametrize(
    ("question", "focus"),
    [
        ("Who signed the lease for the Berlin office?", "signed"),  # who + verb: the verb
        ("Who was the release manager for 4.2?", "manager"),  # who + auxiliary: the noun phrase's head
        ("What was the budget of the migration project?", "budget"),  # cut at "of"
        ("How many replicas does staging run?", "replicas"),
        ("How much memory does the cache use?", "memory"),
        ("How much did each monitor cost?", None),  # "cost" names the answer's form
        ("What's the retention period, and who set it?", "period"),
        ("What time does the standup start?", None),  # the answer is a value, not the word "time"
        ("Which pull request added caching?", None),  # the answer is a document
        ("Which function parses dates?", None),  # the answer is code
        ("Who's on call?", None),
        ("Which Slack channel discussed the outage?", None),  # the head names the answer's form
        ("How do I deploy the billing service?", None),  # not a who/what/which/how-many question
        ("Who can approve a refund?", "approve"),  # who + modal + verb
        ("Who else maintains the billing client?", "maintains"),
        ("What does the retry flag mean?", None),  # "do": a subject and its verb, the asked thing unnamed
        ("What caused the billing outage?", None),  # "what" is the subject of "caused"
        ('What is the "retry budget: none" setting for?', None),  # a quoted span is no part of the focus
        ("What is the bud\u200bget of the migration?", "budget"),  # an invisible character splits no word
        ("What happened to latency after the cache was enabled?", None),  # "what" is the subject of a verb
        ("What changed in the 4.2 release?", None),
        ("What changed recently in the retry policy?", None),  # a verb before an adverb
        ("What changed yesterday?", None),
        ("What went wrong with the billing deploy?", None),
        ("What embedded database does the billing service use?", "database"),  # a participle, then the noun
        ("What has changed in the 4.2 release?", None),
        ("What was deployed on Friday?", None),
        ("How many engineers work on the billing service?", "engineers"),  # "how many" counts a plural
        ("How many people attended the review?", None),
        ("Who originally wrote the billing client?", "wrote"),  # an adverb is no part of the phrase
        ("What really changed in the 4.2 release?", None),
        ("What was sent to the vendor?", None),  # an irregular participle: "what" is its subject
        ("What got fixed in the 4.2 release?", None),  # "get" as the passive's auxiliary
        ("Who remains owner of the billing client?", "owner"),  # a linking verb names a role, not an act
        ("Which service calls the billing client?", "service"),  # a verb and its object end the phrase
        ("Who was the payroll manager that signed off?", "manager"),  # "that" after a noun is relative, no object
        ("What turned out to be the cause of the billing outage?", "cause"),  # a catenative verb links like "is"
        ("Who ended up being the release manager?", "manager"),
    ],
)
def test_question_focus_names_what_the_question_asks_about(question, focus):
    assert question_focus(question) == focus


@pytest.mark.django_db
def test_evidence_about_the_topic_that_never_mentions_the_focus_is_a_partial_answer(kb):
    """A near miss: the evidence is about the question's topic (the billing deploy) but never says
    the asked detail (who approves it). The verdict is partial, naming the focus; evidence that
    states it is an answer."""
    scope = scope_for_user(kb.acme.admin)
    question = "Who approves a deploy of the billing service?"
    topic = _block(
        1,
        "Runbook > Deploying the billing service",
        "To deploy the billing service run make release from the ops repository. "
        "A deploy of the billing service takes about ten minutes.",
        lexical_rank=1,
        dense_rank=1,
        similarity=0.75,
    )
    verdict = judge(question, [topic], scope)
    assert verdict.missing_focus == "approves" and verdict.status == PARTIAL, verdict
    answer = extractive_answer(question, [topic], verdict=verdict)
    assert answer.text.startswith(missing_focus_note("approves")) and text_declines(answer.text)

    approval = " Every deploy of the billing service is approved by the payments lead."
    stated = _block(1, topic.title, topic.text + approval, lexical_rank=1, dense_rank=1, similarity=0.75)
    verdict = judge(question, [stated], scope)
    assert verdict.missing_focus == "" and verdict.status == ANSWERED, verdict


@pytest.mark.django_db
def test_asking_who_knows_a_topic_is_answered_by_the_people_credited_not_by_the_asking_words(kb):
    """ "Who knows / can I ask about / set up X": once the who_knows tool credits people for X, the
    asking words are neither the focus nor terms the evidence must hold. Without a person
    credited, the question is read as any other (the evidence must say who), and a question asking
    for an act a document records ("Who approves ...") keeps its focus either way."""
    scope = scope_for_user(kb.acme.admin)
    person, commit = _credited_person_and_commit()
    for question in ("Who can I ask about the billing deploy?", "Who knows about the billing deploy?"):
        verdict = judge(question, [person, commit], scope)
        assert verdict.status == ANSWERED and not verdict.missing_focus, (question, verdict)
        assert not ({"ask", "know", "knows"} & set(verdict.scored.weights)), verdict.scored.weights
    alone = judge("Who knows about the billing deploy?", [commit], scope)
    assert alone.missing_focus == "knows" and alone.status == PARTIAL, alone
    # People credited only by a document other than the evidence that answers (an authorless
    # package's source answers; a commit merely mentioning the topic credits its author): no answer.
    elsewhere = dataclasses.replace(person, metadata={"documents": [{"document_id": 99, "title": "x", "credit": 1.0}]})
    verdict = judge("Who knows about the billing deploy?", [elsewhere, commit], scope)
    assert verdict.missing_focus == "knows" and verdict.status == PARTIAL, verdict
    verdict = judge("Who approves the billing deploy?", [person, commit], scope)
    assert verdict.missing_focus == "approves" and verdict.status == PARTIAL, verdict
    # ... also beside a clause asking who knows: only the asking words are set aside.
    verdict = judge("Who approves the billing deploy, and who knows about it?", [person, commit], scope)
    assert verdict.missing_focus == "approves" and verdict.status == PARTIAL, verdict


@pytest.mark.django_db
def test_the_focus_is_looked_for_in_block_titles_but_never_held_against_code(kb):
    scope = scope_for_user(kb.acme.admin)
    titled = _block(
        1,
        "Approval of billing deploys",
        "Billing deploys need the payments lead before release.",
        lexical_rank=1,
        dense_rank=1,
        similarity=0.7,
    )
    scored = score_question_evidence("Who approves billing deploys?", [titled], scope)
    assert missing_focus("Who approves billing deploys?", scored, [titled]) == ""
    code = _block(
        1,
        "billing/retry.py: compute_backoff",
        "def compute_backoff(attempt):\n    return 2 ** attempt",
        kind="code_chunk",
        lexical_rank=1,
        dense_rank=1,
        similarity=0.7,
    )
    question = "What multiplier does the billing backoff use?"
    scored = score_question_evidence(question, [code], scope)
    assert question_focus(question) == "multiplier"
    assert missing_focus(question, scored, [code]) == ""


@pytest.mark.django_db
def test_an_agent_noun_is_looked_for_as_written_not_by_its_verbs_stem(kb):
    """ "Commander" and "commands" share the stem ``command``: a passage about commands names no
    incident commander. The word as written (or its plural) answers."""
    scope = scope_for_user(kb.acme.admin)
    question = "Who was the incident commander during the billing outage?"
    about = _block(
        1,
        "Postmortem: billing outage",
        "During the billing outage the on-call engineer ran the failover commands from the runbook. "
        "The billing outage lasted forty minutes.",
        lexical_rank=1,
        dense_rank=1,
        similarity=0.75,
    )
    verdict = judge(question, [about], scope)
    assert verdict.missing_focus == "commander" and verdict.status == PARTIAL, verdict
    named = _block(
        1,
        about.title,
        about.text + " Priya Raman was the incident commander for the billing outage.",
        lexical_rank=1,
        dense_rank=1,
        similarity=0.75,
    )
    assert judge(question, [named], scope).missing_focus == ""
    # The verb naming its agent names the person too.
    approver = _block(
        1,
        "Refunds > Refund 4471",
        "Refund 4471 for the billing outage was approved by Dana Ruiz.",
        lexical_rank=1,
        dense_rank=1,
        similarity=0.75,
    )
    assert judge("Who was the approver of refund 4471?", [approver], scope).missing_focus == ""
    # A word whose stem keeps its ending is matched by its stem as before.
    assert not agent_noun("owner", frozenset({"owner"})) and agent_noun("commander", frozenset({"command"}))


@pytest.mark.django_db
def test_a_count_must_stand_beside_what_it_counts(kb):
    """ "How many customers ...": a number in a sentence about minutes is no count of customers; the
    answer type "number" is held only by a sentence that holds the focus and a number."""
    scope = scope_for_user(kb.acme.admin)
    question = "How many customers were affected by the billing outage?"
    text = (
        "The billing outage hit some customers because invoices were sent again. "
        "Invoices were delayed for about 52 minutes during the billing outage."
    )
    apart = _block(1, "Postmortem: billing outage", text, lexical_rank=1, dense_rank=1, similarity=0.75)
    verdict = judge(question, [apart], scope)
    assert verdict.status == PARTIAL and verdict.missing_type == "number", verdict
    counted = _block(
        1,
        apart.title,
        text + " In all, 312 customers were affected by the billing outage.",
        lexical_rank=1,
        dense_rank=1,
        similarity=0.75,
    )
    verdict = judge(question, [counted], scope)
    assert verdict.missing_type == "" and verdict.status == ANSWERED, verdict
    # Under a heading naming what is counted, the number may stand in any sentence.
    impact = "The billing outage lasted an hour. About 40 accounts saw failed payments during the billing outage."
    section = _block(
        1, "Postmortem: billing outage > Customer impact", impact, lexical_rank=1, dense_rank=1, similarity=0.75
    )
    assert judge(question, [section], scope).missing_type == ""


@pytest.mark.django_db
def test_a_commits_subject_line_answers_which_commit_made_a_change(kb):
    """A commit's text may be only the files it changed; its subject line is what its author said it
    does, so the extractive answer quotes it (a document's heading never stands in for an answer)."""
    scope = scope_for_user(kb.acme.admin)
    question = "Which commit added retries to the billing webhook client?"
    commit = _block(
        1,
        "Add retries with exponential backoff to the billing webhook client (#512)",
        "Files changed: billing/webhook.py tests/test_webhook.py",
        kind="commit",
        lexical_rank=1,
        dense_rank=1,
        similarity=0.7,
    )
    assert [p.text for p in block_passages(commit, subject_line=True)][0] == commit.title
    assert commit.title not in [p.text for p in block_passages(commit)]
    verdict = judge(question, [commit], scope)
    answer = extractive_answer(question, [commit], verdict=verdict)
    assert answer.answers and "billing webhook client" in answer.text and "[1]" in answer.text, answer.text
    # Asked how to do it, not which commit did it: the subject line is no answer.
    how = "How do I add retries to the billing webhook client?"
    answer = extractive_answer(how, [commit], verdict=judge(how, [commit], scope))
    assert "[1]" not in answer.text, answer.text
    page = _block(1, "Webhooks > Retries", "The client retries a failed webhook three times.")
    assert page.title not in [p.text for p in block_passages(page)]


@pytest.mark.django_db
def test_a_word_in_capitals_in_the_question_does_not_narrow_what_the_answer_quotes(kb):
    """Only blocks holding an identifier the question names are quoted; "DB" is a word, not one, so
    the block that answers is quoted though another block's file list holds "db"."""
    scope = scope_for_user(kb.acme.admin)
    question = "How do I close the DB session of the billing service after the response is sent?"
    answer_block = _block(
        1,
        "Billing service > Sessions",
        "The billing service closes its database session in the dependency's exit code, after the response is sent.",
        lexical_rank=1,
        dense_rank=1,
        similarity=0.8,
    )
    listing = _block(
        2,
        "Bump the driver",
        "Files changed: billing/db.py",
        kind="commit",
        lexical_rank=2,
        dense_rank=2,
        similarity=0.4,
    )
    verdict = judge(question, [answer_block, listing], scope)
    answer = extractive_answer(question, [answer_block, listing], verdict=verdict)
    assert answer.answers and "[1]" in answer.text and "[2]" not in answer.text, answer.text


def test_the_gate_notes_show_the_questions_words_as_written():
    """A "[1]" the asker wrote is no citation in the note, "__init__" no bold text."""
    from search.pipeline.drafts import gate_notes
    from search.pipeline.gate import Verdict

    notes = gate_notes(Verdict(status=PARTIAL, missing_terms=("__init__", "[1]"), missing_focus="approves"))
    assert notes[0] == missing_terms_note(["\\_\\_init\\_\\_", "(1)"])
    assert notes[1] == missing_focus_note("approves")


def test_a_decline_never_says_the_sources_answer_in_part():
    """A not-found answer names what the evidence lacks without contradicting its own opening."""
    block = _block(1, "Leadership offsite", "The offsite agenda lists the planning sessions.", lexical_rank=1)
    for verdict in (Verdict(status=NOT_FOUND, missing_terms=("CEO",)), Verdict(status=NOT_FOUND, missing_focus="host")):
        text = extractive_answer("Who is the CEO hosting the offsite?", [block], verdict=verdict).text
        assert text.startswith("The sources I can read do not answer this.") and "in part" not in text, text
        assert "do not mention" in text


@pytest.mark.parametrize(
    ("question", "focus"),
    [
        ("Which customer asked for the audit export?", "customer"),
        ("What vendor supplies the badge readers?", "vendor"),
        ("Who was the release manager for 2.3?", "manager"),
        ("Who is the owner of the billing service?", "owner"),
        # a who-question's verb is answered by a reply in its own words ("I can take it")
        ("Who volunteered to take the on-call shift?", None),
        # neither a party noun nor a who-question
        ("Which service calls the billing webhook?", None),
        ("What is the retry limit for the billing webhook?", None),
        ("How many customers were affected by the outage?", None),
        ("Who's the release manager for 2.3?", "manager"),
        ("Which of our customers asked for SCIM provisioning?", "customers"),
        ("Quick check: who is the owner of the billing service?", "owner"),
        # a relative "who" is not what is asked
        ("How should we notify customers who were affected by the data loss?", None),
    ],
)
def test_a_question_asking_for_a_party_has_a_party_focus(question, focus):
    from search.pipeline.answer_types import party_focus

    assert party_focus(question) == focus


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("The audit export was requested by Initech last week.", True),
        ("Dana Whitfield asked for the audit export.", True),
        ("The request came from @dana in the support channel.", True),
        ("Write to ops@example.com about the audit export.", True),
        ("The audit export was approved by Mark.", True),
        ("Mark asked for the audit export.", True),  # a common word that is a first name, before a verb
        ("The audit export came from Björn Müller.", True),
        ("The request came from the Platform Team.", True),
        # a speaker's label, a weekday, a pronoun opening the sentence
        ("Priya Raman: a customer asked about the audit export", False),
        ("We shipped the audit export by Friday.", False),
        # no one named: sentence-initial common words, a field name, the asker's own words
        ("Covered customers get the audit export within a day.", False),
        ("Mitigation: run the audit export again.", False),
        ("Customer Success tracks every audit export request.", False),
        ("The Audit Export is a scheduled customer job.", False),
    ],
)
def test_a_sentence_names_someone_only_with_a_name_the_question_lacks(text, names):
    from search.pipeline.answer_types import names_someone

    question = "Which customer asked for the audit export?"
    focus = "team" if "Team" in text else "customer"
    assert names_someone(text, question, focus) is names


@pytest.mark.django_db
def test_a_party_must_be_named_beside_the_focus(kb):
    """ "Which customer ...": a sentence about "a scheduled customer load test" is about a customer
    and names none, so the answer is partial with the missing type "name"; a sentence naming the
    customer beside the focus answers, and so does a chat reply after the message asking."""
    scope = scope_for_user(kb.acme.admin)
    question = "Which customer requested the audit log export?"
    text = (
        "The audit log export runs nightly for every customer account. "
        "The audit log export was requested during the quarterly planning review."
    )
    unnamed = _block(1, "Audit log export", text, lexical_rank=1, dense_rank=1, similarity=0.75)
    verdict = judge(question, [unnamed], scope)
    assert verdict.status == PARTIAL and verdict.missing_type == "name", verdict
    named = _block(
        1,
        unnamed.title,
        text + " The customer Globodyne requested the audit log export in March.",
        lexical_rank=1,
        dense_rank=1,
        similarity=0.75,
    )
    verdict = judge(question, [named], scope)
    assert verdict.missing_type == "" and verdict.status == ANSWERED, verdict
    # A name written elsewhere in the block, away from the focus, is no answer to "which customer".
    apart = _block(
        1,
        unnamed.title,
        "Priya Raman wrote the audit log export. " + text,
        lexical_rank=1,
        dense_rank=1,
        similarity=0.75,
    )
    assert judge(question, [apart], scope).missing_type == "name"


@pytest.mark.parametrize(
    ("question", "focus"),
    [
        ("Did Dana get an offer after the onsite interview?", "offer"),
        ("Did Jane Doe, the SRE candidate from the phone screen, end up getting an offer?", "offer"),
        ("Does the proxy strip the prefix?", "prefix"),
        ("Does FastAPI call a sub-dependency once when two dependencies use it?", "sub-dependency"),
        # the only determiner opens the subject: no object asked about
        ("Does the official editor extension work in Cursor?", None),
        # no determiner, or not a do-support yes/no question
        ("Did Redwood lose Helio Health's audit events?", None),
        ("Is the staging proxy on port 8080?", None),
        ("What did the team ship?", None),
    ],
)
def test_a_do_question_asks_about_the_object_of_its_verb(question, focus):
    from search.pipeline.answer_types import yes_no_focus

    assert yes_no_focus(question) == focus


@pytest.mark.django_db
def test_a_yes_no_question_whose_object_the_evidence_never_mentions_is_a_partial_answer(kb):
    """ "Did Dana get an offer ...": an interview write-up that never mentions an offer is about the
    interview, not the answer; one that says the offer was made answers."""
    scope = scope_for_user(kb.acme.admin)
    question = "Did Dana Whitfield get an offer after the platform engineer interview?"
    notes = (
        "Platform engineer interview with Dana Whitfield. Strong systems design, clear communication. "
        "Next steps: reference checks."
    )
    interview = _block(1, "Interview: platform engineer", notes, lexical_rank=1, dense_rank=1, similarity=0.8)
    verdict = judge(question, [interview], scope)
    assert verdict.status == PARTIAL and verdict.missing_focus == "offer", verdict
    offered = _block(
        1,
        interview.title,
        notes + " Dana Whitfield got an offer after the interview and accepted it.",
        lexical_rank=1,
        dense_rank=1,
        similarity=0.8,
    )
    assert judge(question, [offered], scope).missing_focus == ""


@pytest.mark.parametrize(
    ("word", "variants"),
    [
        ("behaviour", ["behavior"]),
        ("normalize", ["normalise"]),
        ("auth", ["authentication", "authorization"]),
        ("authentication", ["auth", "authn"]),
        ("maximum", ["max"]),
        ("four", []),  # too short for a spelling rule: never "for"
        ("deploy", []),
    ],
)
def test_a_word_has_its_other_spellings_and_abbreviations(word, variants):
    from search.text import word_variants

    assert word_variants(word) == variants


@pytest.mark.django_db
def test_a_page_in_the_other_spelling_or_the_long_form_holds_the_question_term(kb):
    """A question in British spelling with an abbreviation ("behaviour", "auth") is answered by a
    page writing "behavior" and "authentication": the terms count as held, so its coverage is
    the same as for the question written the page's way."""
    from search.pipeline.passages import score_evidence

    text = "To restore the old behavior, override make_not_authenticated_error in your authentication classes."
    page = _block(1, "Security > HTTP status", text, lexical_rank=1, dense_rank=1, similarity=0.8)
    british = score_evidence("How do I restore the old auth behaviour?", [page], df={}, n_rows=100)
    american = score_evidence("How do I restore the old authentication behavior?", [page], df={}, n_rows=100)
    assert british.block_coverage[1] == american.block_coverage[1] == 1.0
    assert score_evidence("How do I restore the old colour?", [page], df={}, n_rows=100).block_coverage[1] < 1.0


@pytest.mark.django_db
def test_function_words_and_contraction_tails_are_no_question_terms():
    """A rare function word ("whose", "whether") or a contraction's tail ("I'm" -> "m") weighs
    as much as the rarest topic word by its document frequency, yet no page need write it: it is
    no term the evidence must hold, and a page holding the topic words covers the question."""
    from search.pipeline.passages import score_evidence

    text = "Declare the path parameter with an Enum class: its value is then one of the Enum's members."
    page = _block(1, "Path parameters > Predefined values", text, lexical_rank=1, dense_rank=1, similarity=0.8)
    question = "I'm wondering whether I can declare a path parameter whose value is an Enum member?"
    # Every topic word is common in the scope; the function words are in no row: they would weigh most.
    df = {"declar": 40, "path": 60, "paramet": 60, "valu": 50, "enum": 20, "member": 30, "wonder": 5}
    scored = score_evidence(question, [page], df=df, n_rows=100)
    assert not {"whose", "whether", "m"} & set(scored.weights)
    assert set(scored.weights) == set(df)
    assert scored.missing_from(1, scored.weights) == [("wonder", scored.weights["wonder"])]


@pytest.mark.parametrize(
    "question, dropped",
    [
        ("Which function extracts the parameter names from a route path?", {"function"}),
        ("Which pull request added route path parameters?", {"pull", "request"}),
        ("What class parses route path parameters?", {"class"}),
        ("What does the route path parameter function return?", set()),  # no kind named after "what"
        ("What changes the route path parameters?", set()),  # a verb, not the document noun
        ("Which requests carry route path parameters?", set()),  # requests, not a pull request
    ],
)
@pytest.mark.django_db
def test_the_kind_of_thing_asked_for_is_no_term_the_evidence_must_hold(question, dropped):
    """ "Which *function* ..." is answered by a definition, "Which *pull request* ..." by a commit:
    neither calls itself so, and the word naming the answer's kind is left out of the question's
    terms (a definition holding every other term covers the question)."""
    from search.pipeline.passages import lexeme_sets, score_evidence

    code = "def get_path_param_names(path: str) -> set[str]:\n    return set(re.findall('{(.*?)}', path))"
    block = _block(1, "fastapi/utils.py: get_path_param_names", code, lexical_rank=1, dense_rank=1)
    scored = score_evidence(question, [block], df={}, n_rows=100)
    kind, topic = lexeme_sets([" ".join(dropped), "route path paramet"])
    assert not kind & set(scored.weights) and topic <= set(scored.weights)
    assert ("function" in scored.weights) == ("function" in question and not dropped)
    kept = {"changes": "chang", "requests": "request"}
    assert all(lexeme in scored.weights for word, lexeme in kept.items() if word in question.split())


@pytest.mark.parametrize(
    "question, kept",
    [
        ("Whose job is it to review the billing service?", {"whose"}),  # asks for a person
        ("The deploy failed. Whose change was it?", {"whose"}),
        ("How do I deploy over D-Bus?", {"d"}),  # no contraction: the letter names something
        ("What does the M key do?", {"m"}),
    ],
)
@pytest.mark.django_db
def test_an_asking_whose_and_a_letter_that_is_no_contraction_stay_question_terms(question, kept):
    from search.pipeline.passages import score_evidence

    page = _block(1, "Billing", "The billing service is deployed by make release.", lexical_rank=1, dense_rank=1)
    assert kept <= set(score_evidence(question, [page], df={}, n_rows=100).weights)


def test_a_question_of_function_words_alone_has_nothing_covered():
    """With no term left to hold, the evidence model reads the question as missing everything."""
    scored = ScoredEvidence(weights={}, asked_lexemes=frozenset())
    scored.block_lexemes = {1: frozenset({"billing"})}
    features = answerability_features(scored, [_block(1, "Billing", "The billing service.")])
    assert features["missing"] == 1.0 and features["coverage"] == 0.0


@pytest.mark.parametrize(
    "payload",
    [
        "A" + "a" * 100_000 + "1",
        "a." * 50_000,
        "ab-" * 33_000,
        "Did the x get the " + "(" * 100_000,
        "." * 100_000 + "x",
        "—!" * 50_000,
        "What did the " + "x " * 50_000,
    ],
    ids=["capitalized", "dotted", "hyphenated", "parentheses", "full-stops", "dashes", "what-did"],
)
def test_the_name_yes_no_and_what_did_patterns_are_linear_on_100kb(payload):
    from search.pipeline.answer_types import names_someone, yes_no_focus

    start = time.perf_counter()
    names_someone(payload, "Which customer asked for it?", "customer")
    yes_no_focus(payload)
    object_question_verb(payload)
    # ~0.2 s at worst alone; a quadratic pattern takes over 20 s (the bound leaves room for a busy machine)
    assert time.perf_counter() - start < 5.0


@pytest.mark.parametrize(
    "question, verb",
    [
        ("What did the electrician find when they inspected the panel on Monday?", "find"),
        ("What did the March security audit of our payment service flag?", "flag"),
        ("The rollout stalled. What did the on-call engineer roll back, exactly?", "roll"),
        # past a particle, an adverb or a time word
        ("What did the on-call engineer spin up during the outage?", "spin"),
        ("What did the engineer find yesterday in the payment logs?", "find"),
        ("What did the on-call engineer fix manually?", "fix"),
        ("What did the auditors flag first?", "flag"),
        # reporting and light verbs: the statement itself is the answer
        ("In the phone screen, what did Maya say about the team size?", None),
        ("What did the facilities team recommend checking after the dips?", None),
        # deciding: the decision is stated in any words ("we chose PostgreSQL 16")
        ("What did we decide for the primary database?", None),
        ("What did they end up choosing?", None),
        ("Which firmware did they blame and what did the vendor send over?", None),
        # "does" asks how something behaves, which pages describe in other words
        ("What does the router yield for an included route?", None),
        # no verb found: a preposition ends the subject before it, or a name stands last
        ("What did the team at Acme decide?", None),
        ("What did you ask Priya?", None),
        ("What mistake did the engineer admit?", None),
    ],
)
def test_object_question_verb_is_the_act_a_what_did_question_asks_about(question, verb):
    assert object_question_verb(question) == verb


@pytest.mark.django_db
def test_a_record_of_the_visit_that_never_says_what_was_found_is_a_near_miss(kb):
    """ "What did the electrician find ...?" over a ticket scheduling the visit: partial on "find";
    a ticket saying what was found (the verb's irregular past) answers it."""
    scope = scope_for_user(kb.acme.admin)
    question = "What did the electrician find when they inspected the floor 3 breaker panel?"
    text = (
        "Power blips on floor 3 during lunch. Facilities inspected the floor 3 breaker panel and saw voltage dips. "
        "Electrician scheduled to inspect the breaker panel on Thursday."
    )
    visit = _block(1, "Floor 3 power blips", text, lexical_rank=1, dense_rank=1, similarity=0.75)
    verdict = judge(question, [visit], scope)
    assert verdict.missing_focus == "find" and verdict.status == PARTIAL, verdict
    found = " The electrician found a loose neutral in the floor 3 breaker panel and replaced it."
    report = _block(1, visit.title, text + found, lexical_rank=1, dense_rank=1, similarity=0.75)
    verdict = judge(question, [report], scope)
    assert verdict.missing_focus == "" and verdict.status == ANSWERED, verdict


@pytest.mark.django_db
def test_a_count_of_things_is_no_duration(kb):
    """ "How many instances ...": "48h" measures time and counts no instances; "How many hours ..."
    is answered by it."""
    scope = scope_for_user(kb.acme.admin)
    text = (
        "Cleanup of stale test instances: notify the owners of the stale test instances and wait 48h. "
        "Terminate the stale test instances after that and record their IDs in the ticket."
    )
    cleanup = _block(1, "Cleanup stale test instances", text, lexical_rank=1, dense_rank=1, similarity=0.75)
    question = "How many stale test instances were terminated in the cleanup?"
    verdict = judge(question, [cleanup], scope)
    assert verdict.status == PARTIAL and verdict.missing_type == "number", verdict
    counted = _block(
        1, cleanup.title, text + " In all, 14 stale test instances were terminated.", lexical_rank=1, dense_rank=1
    )
    assert judge(question, [counted], scope).missing_type == ""
    assert judge("How many hours do the owners of stale test instances get?", [cleanup], scope).missing_type == ""
    # millions and thousands are counts ("12M"), minutes are not ("12m")
    assert COUNT_OF_THINGS.held_by("12M instances") and COUNT_OF_THINGS.held_by("40K rows")
    assert not COUNT_OF_THINGS.held_by("after 12m") and COUNT_OF_THINGS.held_by("a dozen, then three more")
    # a number is read whole: "1.5h" is no "1" (nor "2.5GB" a "2"); a unit written apart may count
    # what the question counts ("25 days of paid holiday" for "How many holidays ...")
    assert not COUNT_OF_THINGS.held_by("wait 1.5h, then 2.5GB") and COUNT_OF_THINGS.values("1.5 hours") == ["1.5"]
    assert COUNT_OF_THINGS.held_by("25 days of paid holiday") and COUNT_OF_THINGS.held_by("40 threads")


def test_the_pronoun_one_is_no_count():
    """ "One of the fastest", "no one", "one another" count nothing; "one replica", "one of the three
    nodes" count one."""
    number = asked_answer_type("How many requests per second did the service reach?")
    assert number is not None and number.label == "number"
    for text in ("as one of the fastest frameworks available", "no one measured it", "they call one another"):
        assert not number.held_by(text), text
    for text in ("we run one replica", "one of the three nodes failed"):
        assert number.held_by(text), text


def test_a_quarter_or_fiscal_year_is_a_time_and_no_count():
    """ "Q1 2025", "H2 2024", "FY24" name a period: their year counts nothing."""
    count = asked_answer_type("How many fallback activations did the review count?")
    assert count is not None
    for text in ("events in Q1 2025 where", "the H2 2024 plan", "FY24 budget", "in Q3'25"):
        assert not count.held_by(text), text
    assert count.values("we saw 3 activations in Q2 2025") == ["3"]
    assert count.values("In Q4 12 deals closed") == ["12"]  # a count after a quarter is no year


@pytest.mark.django_db
def test_a_passage_saying_the_matter_is_still_open_does_not_answer_it(kb):
    """The ticket of the right incident says its cause is still being investigated: partial, and
    the answer says so, quoting it; asked whether the cause is known, the same passage answers."""
    scope = scope_for_user(kb.acme.admin)
    sentence = "SUP-1933 (Umbrella, dedicated): runtime stall under peak load; investigation ongoing."
    text = "Open escalations this week. " + sentence + " SUP-1917 (Initech): SDK timeout, resolved by an upgrade."
    ticket = _block(1, "Streaming stalls: open escalations", text, lexical_rank=1, dense_rank=1, similarity=0.75)
    question = "What was the root cause of the runtime stall under peak load in SUP-1933?"
    verdict = judge(question, [ticket], scope)
    assert verdict.status == PARTIAL and verdict.still_open == sentence, verdict
    answer = extractive_answer(question, [ticket], verdict=verdict)
    assert still_open_note(sentence) in answer.text and text_declines(answer.text)
    verdict = judge("Is the cause of the runtime stall in SUP-1933 known yet?", [ticket], scope)
    assert verdict.still_open == "", verdict
    resolved = _block(1, ticket.title, text.replace("investigation ongoing", "caused by a full disk"), lexical_rank=1)
    assert judge(question, [resolved], scope).still_open == ""
    # Something else left open beside the answer, or a question without an asked detail: no rule.
    beside = "The root cause of the runtime stall in SUP-1933 was a full disk; the follow-up audit is TBD."
    assert judge(question, [_block(1, ticket.title, beside, lexical_rank=1)], scope).still_open == ""
    rollback = "Roll back the payments service with `make rollback`; automated rollback of the payments service is TBD."
    how = _block(1, "Runbook > Payments rollback", rollback, lexical_rank=1, dense_rank=1, similarity=0.75)
    assert judge("How do I roll back the payments service?", [how], scope).still_open == ""
