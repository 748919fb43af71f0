"""Hybrid retrieval: RRF arithmetic, merging, scope, principals and tenant isolation."""

import math

import pytest

from search.retrieval import EmptyQuery, Hit, hybrid_search, merge_and_cap, rrf_fuse
from sources.selectors import scope_for_user


def test_rrf_matches_the_formula():
    scores, ranks = rrf_fuse({"lexical": [10, 20, 30], "dense": [20, 40]})
    assert scores[20] == pytest.approx(1 / 62 + 1 / 61)
    assert scores[10] == pytest.approx(1 / 61)
    assert scores[40] == pytest.approx(1 / 62)
    assert ranks[20] == {"lexical": 2, "dense": 1}
    assert max(scores, key=scores.get) == 20


def _hit(doc_id, kind, path, score, ranks=None):
    return Hit(
        document_id=doc_id,
        source_id=1,
        kind=kind,
        title=str(doc_id),
        url="",
        path=path,
        start_line=None,
        end_line=None,
        content="",
        text="",
        metadata={},
        updated_at=None,
        parent_id=None,
        external_id=str(doc_id),
        score=score,
        ranks=ranks if ranks is not None else {"lexical": doc_id},
    )


def _ingest_rows(tenant, rows, name="Notes"):
    """A ``test_rows`` source of ``tenant`` (a ``make_tenant`` result) holding ``rows``, ingested."""
    from sources.services import source_create, source_ingest

    source = source_create(
        tenant_id=tenant.tenant.pk,
        kind="test_rows",
        name=name,
        config={"rows": rows},
        project_ids=[tenant.project.pk],
    )
    assert source_ingest(tenant_id=tenant.tenant.pk, source_id=source.pk).status == "succeeded"
    return source


def test_merge_folds_file_rows_into_chunks_and_caps_per_file():
    hits = [
        _hit(1, "code_chunk", "a.py", 1 / 61 + 1 / 63, {"lexical": 1, "dense": 3}),
        _hit(2, "code_file", "a.py", 1 / 62, {"dense:document": 2}),
        _hit(3, "code_chunk", "a.py", 0.03),
        _hit(4, "code_chunk", "a.py", 0.02),
        _hit(5, "code_chunk", "a.py", 0.015),
        _hit(6, "doc_section", "b.md", 0.01),
    ]
    merged = merge_and_cap(hits, per_group=3)
    assert [h.document_id for h in merged] == [1, 3, 4, 6]
    # the file row's vote (another list) joins its best chunk
    assert merged[0].score == pytest.approx(1 / 61 + 1 / 63 + 1 / 62)
    assert merged[0].ranks["dense:document:file"] == 2


def test_merge_folds_bursts_into_their_thread():
    thread = _hit(10, "thread", "", 1 / 70, {"dense:document": 10})
    burst = _hit(11, "burst", "", 1 / 61, {"lexical": 1})
    burst.parent_id = 10
    other = _hit(12, "thread", "", 0.012, {"lexical": 23})
    lone = _hit(13, "burst", "", 0.01, {"lexical": 40})
    lone.parent_id = 99  # its thread did not rank: the burst stands for it
    merged = merge_and_cap([burst, thread, other, lone])
    assert [h.document_id for h in merged] == [10, 12, 13]
    assert merged[0].score == pytest.approx(1 / 70 + 1 / 61) and merged[0].ranks["lexical:burst"] == 1


@pytest.mark.django_db
def test_search_finds_the_right_section_for_a_described_question(kb):
    scope = scope_for_user(kb.acme.admin)
    hits = hybrid_search("how do I ship a new version of the billing service?", scope).hits
    assert hits[0].external_id == "runbook#deploy"
    hits = hybrid_search("how many days off do I get each year", scope).hits
    assert hits[0].external_id == "handbook#vacation"


@pytest.mark.django_db
def test_identifier_parts_find_code(kb):
    scope = scope_for_user(kb.acme.admin)
    hits = hybrid_search("compute_backoff", scope).hits
    assert hits[0].external_id == "billing/retry.py#compute_backoff"
    assert hits[0].url == "billing/retry.py#L10-L24"
    assert hits[0].metadata == {"symbol": "compute_backoff", "language": "python"}


@pytest.mark.django_db
def test_search_never_returns_another_tenants_rows(kb):
    scope = scope_for_user(kb.acme.admin)
    hits = hybrid_search("zebra protocol Globex deploys billing", scope, limit=50).hits
    assert hits, "acme's own billing rows should still match"
    assert all("zebra" not in h.content for h in hits)
    assert {h.source_id for h in hits} == {kb.acme_source_id}


@pytest.mark.django_db
def test_forged_scope_with_another_tenants_sources_returns_nothing(kb):
    from dataclasses import replace

    from kbportal.tenancy import tenant_context
    from sources.models import DataSource

    with tenant_context(kb.globex.tenant.pk):
        globex_sources = tuple(DataSource.objects.values_list("pk", flat=True))
    forged = replace(scope_for_user(kb.acme.admin), allowed_source_ids=globex_sources)
    assert hybrid_search("zebra protocol", forged, limit=50).hits == []


@pytest.mark.django_db
def test_restricted_rows_only_for_their_principals(kb):
    admin_hits = hybrid_search(kb.private_marker, scope_for_user(kb.acme.admin)).hits
    member_hits = hybrid_search(kb.private_marker, scope_for_user(kb.acme_member)).hits
    assert admin_hits[0].external_id == "hr#salaries"
    assert all(h.external_id != "hr#salaries" for h in member_hits)


@pytest.mark.django_db
def test_empty_question_is_a_clear_error(kb):
    with pytest.raises(EmptyQuery, match="empty"):
        hybrid_search("   ", scope_for_user(kb.acme.admin))


def test_query_intents_and_identifiers_follow_the_wording():
    from search.retrieval import query_identifiers, query_intents

    assert set(query_intents("Which function turns errors into JSON?")) == {"code"}
    assert set(query_intents("What recent change fixed the cookie parser?")) == {"history"}
    # a task ("how do I ...") is explained by guides: their own lists, beside the whole index's
    assert set(query_intents("How do I set a cookie with FastAPI?")) == {"docs"}
    assert set(query_intents("how to stream a response")) == {"docs"}
    assert query_intents("How does the cookie parser treat quotes?") == {}
    assert query_identifiers("Where is DependencyScopeError defined, and `run_app()`?") == [
        "dependencyscopeerror",
        "run_app",
    ]


@pytest.mark.django_db
def test_symbol_ranker_puts_the_named_definition_first(kb):
    scope = scope_for_user(kb.acme.admin)
    result = hybrid_search("what does compute_backoff return for attempt 3", scope)
    assert result.hits[0].external_id == "billing/retry.py#compute_backoff"
    assert result.hits[0].ranks["symbol"] == 1


def test_recency_ranks_share_ties_and_skip_undated():
    from datetime import UTC, datetime

    from search.retrieval import recency_ranks

    hits = [_hit(i, "doc_section", f"{i}.md", 0.0) for i in range(1, 5)]
    hits[0].updated_at = datetime(2024, 1, 1, tzinfo=UTC)
    hits[1].updated_at = datetime(2025, 1, 1, tzinfo=UTC)
    hits[2].updated_at = datetime(2025, 1, 1, tzinfo=UTC)
    assert recency_ranks(hits) == {2: 1, 3: 1, 1: 2}


@pytest.mark.django_db
def test_context_expansion_adds_neighbours_and_enclosing_signature(make_tenant, settings):
    from sources.services import source_create, source_ingest

    settings.KB_CUSTOM_CONNECTORS = {"test_rows": "tests.search.rows_connector.RowsConnector"}
    t = make_tenant("ctx")
    rows = [
        {
            "external_id": "guide#intro",
            "kind": "doc_section",
            "title": "Guide > Intro",
            "path": "guide.md",
            "content": "Welcome to the pelican guide.",
            "metadata": {"next_section": "guide#setup"},
        },
        {
            "external_id": "guide#setup",
            "kind": "doc_section",
            "title": "Guide > Setup",
            "path": "guide.md",
            "content": "Install the pelican toolkit with pip.",
            "metadata": {"prev_section": "guide#intro", "next_section": "guide#usage"},
        },
        {
            "external_id": "guide#usage",
            "kind": "doc_section",
            "title": "Guide > Usage",
            "path": "guide.md",
            "content": "Run pelican serve to preview.",
        },
        {
            "external_id": "app.py#Server.start",
            "kind": "code_chunk",
            "title": "app.py: Server.start",
            "path": "app.py",
            "start_line": 5,
            "end_line": 9,
            "content": "def start(self): bind the walrus socket",
            "metadata": {"symbol": "Server.start", "enclosing_signature": "class Server(BaseServer):"},
        },
    ]
    source = source_create(
        tenant_id=t.tenant.pk, kind="test_rows", name="Ctx", config={"rows": rows}, project_ids=[t.project.pk]
    )
    assert source_ingest(tenant_id=t.tenant.pk, source_id=source.pk).status == "succeeded"
    hits = {h.external_id: h for h in hybrid_search("install the pelican toolkit", scope_for_user(t.admin)).hits}
    assert hits["guide#setup"].context == (
        "previous section: Guide > Intro: Welcome to the pelican guide.\n"
        "next section: Guide > Usage: Run pelican serve to preview."
    )
    hits = {h.external_id: h for h in hybrid_search("walrus socket", scope_for_user(t.admin)).hits}
    assert hits["app.py#Server.start"].context == "enclosing: class Server(BaseServer):"


@pytest.mark.slow
@pytest.mark.django_db
def test_idf_statistics_drop_ubiquitous_terms_and_rank_rare_ones(make_tenant, settings):
    from kbportal.tenancy import tenant_context
    from search.retrieval import lexical_ranking, query_terms, rare_term_ranking
    from sources.models import DataSource, Document, TermStat
    from sources.services import source_create, source_ingest

    settings.KB_CUSTOM_CONNECTORS = {"test_rows": "tests.search.rows_connector.RowsConnector"}
    t = make_tenant("idf")
    filler = [
        {
            "external_id": f"note{i}",
            "kind": "conversation",
            "title": f"standup {i}",
            "content": f"standup notes {i}: thanks, sounds good! the deploy went fine, nothing to report today.",
        }
        for i in range(120)
    ]
    rows = filler + [
        {
            "external_id": "rare-short",
            "kind": "conversation",
            "title": "pager",
            "content": "ERR_QUOKKA_TIMEOUT on the payments gateway, restart it",
        },
        {
            "external_id": "rare-long",
            "kind": "doc_section",
            "title": "gateway handbook",
            "content": "ERR_QUOKKA_TIMEOUT " + " ".join(f"word{i}" for i in range(400)),
        },
    ]
    source = source_create(
        tenant_id=t.tenant.pk, kind="test_rows", name="Chat", config={"rows": rows}, project_ids=[t.project.pk]
    )
    assert source_ingest(tenant_id=t.tenant.pk, source_id=source.pk).status == "succeeded"
    scope = scope_for_user(t.admin)
    with tenant_context(t.tenant.pk):
        assert DataSource.objects.get(pk=source.pk).indexed_rows == 122
        assert TermStat.objects.get(source=source, lexeme="standup").ndoc == 120
        terms = query_terms("thanks, sounds good! any ERR_QUOKKA_TIMEOUT today?", scope)
        assert "thank" not in terms.kept() and "errquokkatimeout" in terms.kept()
        assert dict(terms.rare())["errquokkatimeout"] == pytest.approx(math.log(122 / 2))
        assert "standup" not in dict(terms.rare())
        ranked = rare_term_ranking("thanks, sounds good! any ERR_QUOKKA_TIMEOUT today?", scope, terms=terms)
        ids = {d.pk: d.external_id for d in Document.objects.filter(pk__in=ranked)}
        assert [ids[i] for i in ranked] == ["rare-short", "rare-long"]
        # A row with only common words is not in the rare list at all, nor in the lexical one.
        lexical = lexical_ranking("thanks, sounds good! any ERR_QUOKKA_TIMEOUT today?", scope, terms=terms)
        assert set(lexical) == set(ranked)


@pytest.mark.django_db
def test_symbol_name_ranker_reads_the_words_of_definition_names(make_tenant, settings):
    import importlib

    from kbportal.tenancy import tenant_context
    from search.retrieval import SYMBOL_WORDS_SQL, query_terms, symbol_name_ranking
    from sources.models import Document
    from sources.services import source_create, source_ingest

    settings.KB_CUSTOM_CONNECTORS = {"test_rows": "tests.search.rows_connector.RowsConnector"}
    t = make_tenant("symwords")

    def chunk(symbol: str, body: str) -> dict:
        return {
            "external_id": f"errors.py#{symbol}",
            "kind": "code_chunk",
            "title": f"errors.py: {symbol}",
            "path": "errors.py",
            "start_line": 1,
            "end_line": 3,
            "content": body,
            "metadata": {"symbol": symbol, "symbol_kind": "class"},
        }

    rows = [
        chunk("HTTPException", "class HTTPException(Exception): raised for an error response"),
        chunk("WebSocketRequestValidationError", "class WebSocketRequestValidationError(ValidationException): pass"),
        chunk("APIRoute", "class APIRoute: a route with request validation of its body"),
        chunk("ValidationError", "class ValidationError(Exception): pass"),
    ]
    source = source_create(
        tenant_id=t.tenant.pk, kind="test_rows", name="Code", config={"rows": rows}, project_ids=[t.project.pk]
    )
    assert source_ingest(tenant_id=t.tenant.pk, source_id=source.pk).status == "succeeded"
    scope = scope_for_user(t.admin)
    question = "Which error is raised when a web socket request fails validation?"
    with tenant_context(scope.tenant_id):
        ranked = symbol_name_ranking(scope, terms=query_terms(question, scope), kinds=["code_chunk"])
        external = dict(Document.objects.filter(pk__in=ranked).values_list("pk", "external_id"))
    names = [external[i] for i in ranked]
    assert names[0] == "errors.py#WebSocketRequestValidationError"
    assert "errors.py#HTTPException" not in names  # no word of its name is asked for
    # Prose writes "websocket" as one word; the name's adjacent words "web socket" still match.
    question = "Which error is raised when a websocket message fails validation?"
    with tenant_context(scope.tenant_id):
        ranked = symbol_name_ranking(scope, terms=query_terms(question, scope), kinds=["code_chunk"])
    assert external[ranked[0]] == "errors.py#WebSocketRequestValidationError"
    # "Which function ..." restricts the names to functions (and long functions' parts).
    handler = chunk("websocket_request_validation_handler", "def websocket_request_validation_handler(): ...")
    handler["external_id"] = "errors.py#handler"
    handler["metadata"]["symbol_kind"] = "function"
    _ingest_rows(t, [handler], name="Handlers")
    scope = scope_for_user(t.admin)
    with tenant_context(scope.tenant_id):
        terms = query_terms(question, scope)
        classes = symbol_name_ranking(scope, terms=terms, kinds=["code_chunk"], symbol_kinds=["class"])
        functions = symbol_name_ranking(scope, terms=terms, kinds=["code_chunk"], symbol_kinds=["function"])
        external = dict(Document.objects.filter(pk__in=classes + functions).values_list("pk", "external_id"))
    assert "errors.py#handler" not in [external[i] for i in classes]
    assert external[classes[0]] == "errors.py#WebSocketRequestValidationError"
    assert [external[i] for i in functions] == ["errors.py#handler"]
    # The planner can only use the expression index when the query's expression is the index's.
    migration = importlib.import_module("sources.migrations.0008_symbol_words_index")
    assert SYMBOL_WORDS_SQL.replace("d.metadata", "metadata") == migration.EXPRESSION


def test_portal_links_become_absolute_with_a_public_url(settings):
    from search.retrieval import portal_link

    source = "0b0b0b0b-0000-4000-8000-000000000001"
    assert portal_link("https://github.com/x/y", source, "a.py") == "https://github.com/x/y"
    relative = portal_link("a.py#L3-L9", source, "a.py#f", 3)
    assert relative == f"/documents/{source}/?id=a.py%23f#L3"
    settings.KB_PUBLIC_URL = "https://kb.example.com/"
    assert (
        portal_link("a.py#L3-L9", source, "a.py#f", 3) == f"https://kb.example.com/documents/{source}/?id=a.py%23f#L3"
    )


@pytest.mark.slow
@pytest.mark.django_db
def test_champion_lists_bound_what_a_common_term_ranks(make_tenant, settings):
    """A lexeme too common to rank every row is ranked over its champion list only, while rows
    holding the rarer terms, all the terms, or another tenant's rows behave as before."""
    from kbportal.tenancy import tenant_context
    from search.retrieval import lexical_ranking, query_terms
    from sources.models import Document, TermStat
    from sources.services import source_create, source_ingest, source_refresh_champions

    settings.KB_CUSTOM_CONNECTORS = {"test_rows": "tests.search.rows_connector.RowsConnector"}
    t = make_tenant("champ")
    rows = (
        [
            {
                "external_id": f"plain{i}",
                "kind": "doc_section",
                "title": f"note {i}",
                "content": f"the ledger was reconciled on day {i} " + " ".join(f"filler{j}" for j in range(i % 30)),
            }
            for i in range(60)
        ]
        + [
            {"external_id": f"other{i}", "kind": "doc_section", "title": f"other {i}", "content": f"lunch menu {i}"}
            for i in range(200)
        ]
        + [
            {"external_id": "titled", "kind": "doc_section", "title": "Ledger", "content": "ledger ledger"},
            {
                "external_id": "both",
                "kind": "doc_section",
                "title": "month end",
                "content": "the ledger and the escrow account at month end " + "padding " * 80,
            },
            {
                "external_id": "rare",
                "kind": "doc_section",
                "title": "escrow",
                "content": "escrow release needs two approvals " + "padding " * 80,
            },
        ]
    )
    source = source_create(
        tenant_id=t.tenant.pk, kind="test_rows", name="Notes", config={"rows": rows}, project_ids=[t.project.pk]
    )
    assert source_ingest(tenant_id=t.tenant.pk, source_id=source.pk).status == "succeeded"
    scope = scope_for_user(t.admin)
    with tenant_context(t.tenant.pk):
        ids = dict(Document.objects.filter(source=source).values_list("external_id", "pk"))
        assert not TermStat.objects.filter(source=source, champions__isnull=False).exists()  # all under 2,000 rows
        full = lexical_ranking("ledger", scope, limit=100)
        assert len(full) == 62  # every row holding the term

        assert source_refresh_champions(source.pk, min_df=20, per_term=5) >= 1
        champions = TermStat.objects.get(source=source, lexeme="ledger").champions
        assert len(champions) == 5 and champions[0] == ids["titled"]  # a title position weighs most
        terms = query_terms("ledger escrow", scope)
        assert terms.championed("ledger") and not terms.championed("escrow")
        ranked = lexical_ranking("ledger escrow", scope, terms=terms, limit=100)
        # champions of 'ledger' + every 'escrow' row (rare: ranked directly), nothing else
        assert set(ranked) == set(champions) | {ids["both"], ids["rare"]}
        # IDF weighting: a row holding the rare 'escrow' (2 rows) outranks the 'ledger' rows (62)
        assert ranked[0] in (ids["both"], ids["rare"])
        # A champion id that no longer exists (row deleted since the refresh) is simply gone.
        Document.objects.filter(pk=champions[1]).delete()
        assert champions[1] not in lexical_ranking("ledger", scope, limit=100)

    # Another tenant's scope holding the same words ranks only its own rows.
    other = make_tenant("champ-other")
    other_source = source_create(
        tenant_id=other.tenant.pk,
        kind="test_rows",
        name="Notes",
        project_ids=[other.project.pk],
        config={"rows": [{"external_id": "o1", "kind": "doc_section", "title": "ledger", "content": "ledger"}]},
    )
    source_ingest(tenant_id=other.tenant.pk, source_id=other_source.pk)
    other_scope = scope_for_user(other.admin)
    with tenant_context(other.tenant.pk):
        own = set(Document.objects.filter(source=other_source).values_list("pk", flat=True))
        assert set(lexical_ranking("ledger escrow", other_scope, limit=100)) == own


@pytest.mark.django_db
def test_full_text_match_is_leakproof_so_the_gin_index_serves_row_level_security(kb):
    """``tsvector @@ tsquery`` is LEAKPROOF (migration sources 0012): under the tenant policy the
    planner may then reach rows through the GIN index instead of scanning the whole tenant
    (measured in ``bench/search_latency.py``); the policy still filters what the index returns."""
    from django.db import connection

    from kbportal.tenancy import tenant_context

    with tenant_context(kb.acme.tenant.pk), connection.cursor() as cursor:
        cursor.execute("SELECT rolbypassrls OR rolsuper FROM pg_roles WHERE rolname = current_user")
        assert cursor.fetchone()[0] is False  # really the app role, subject to the policy
        cursor.execute("SELECT proleakproof FROM pg_proc WHERE oid = 'ts_match_vq(tsvector, tsquery)'::regprocedure")
        assert cursor.fetchone()[0] is True
        cursor.execute("SELECT count(*) FROM sources_document d WHERE d.search_vector @@ 'zebra'::tsquery")
        assert cursor.fetchone()[0] == 0  # globex's 'zebra' rows stay behind the policy
        cursor.execute("SELECT count(*) FROM sources_document d WHERE d.search_vector @@ 'backoff'::tsquery")
        assert cursor.fetchone()[0] >= 1


def test_parts_of_one_function_fold_into_its_first_part():
    """A long function split into parts is one definition: its parts fold into the lowest part
    present (signature and docstring) with the best part's score; other symbols stay apart."""
    part3 = _hit(21, "code_chunk", "docs.py", 0.13)
    part2 = _hit(22, "code_chunk", "docs.py", 0.08)
    other = _hit(23, "code_chunk", "docs.py", 0.078)
    part1 = _hit(24, "code_chunk", "docs.py", 0.077)
    for hit, part in ((part3, 3), (part2, 2), (part1, 1)):
        hit.metadata = {"symbol": "get_swagger_ui_html", "part": part}
    other.metadata = {"symbol": "get_redoc_html", "part": 1}
    merged = merge_and_cap([part3, part2, other, part1], per_group=3)
    assert [h.document_id for h in merged] == [24, 23]
    assert merged[0].score == pytest.approx(0.13)
    assert merged[0].ranks["lexical:part"] in (21, 22)


def test_the_cap_counts_each_class_of_a_long_module_apart():
    """A class and its methods are one unit of the per-file cap; top-level code another."""
    methods = [_hit(31 + i, "code_chunk", "routing.py", 0.1 - i / 100) for i in range(4)]
    for i, hit in enumerate(methods):
        hit.metadata = {"symbol": f"APIRouter.websocket_{i}", "symbol_kind": "method"}
    route = _hit(40, "code_chunk", "routing.py", 0.05)
    route.metadata = {"symbol": "APIWebSocketRoute", "symbol_kind": "class"}
    functions = [_hit(41 + i, "code_chunk", "routing.py", 0.04 - i / 100) for i in range(4)]
    for i, hit in enumerate(functions):
        hit.metadata = {"symbol": f"helper_{i}", "symbol_kind": "function"}
    merged = merge_and_cap([*methods, route, *functions], per_group=3)
    assert [h.document_id for h in merged] == [31, 32, 33, 40, 41, 42, 43]


def test_code_intent_reads_where_the_code_does_something():
    from search.retrieval import query_intents

    assert "code" in query_intents("Where does the framework combine the lifespan of a router with its children?")
    assert "code" in query_intents("Where does FastAPI define the object that schedules background work?")
    assert "code" not in query_intents("Where do I find the onboarding checklist?")
    assert "code" not in query_intents("Where do we handle refunds for annual plans?")


@pytest.mark.django_db
def test_lexical_weighs_terms_by_idf_and_skips_whole_code_files(make_tenant, settings):
    """IDF scoring: one rare term outweighs a common term said many times. A whole code file is
    never ranked lexically (its chunks are), unless code files are all that is asked for."""
    from kbportal.tenancy import tenant_context
    from search.retrieval import lexical_ranking, query_terms
    from sources.models import Document

    settings.KB_CUSTOM_CONNECTORS = {"test_rows": "tests.search.rows_connector.RowsConnector"}
    t = make_tenant("idf")
    rows = (
        [
            {
                "external_id": f"req{i}",
                "kind": "doc_section",
                "title": f"log {i}",
                "content": f"every request is logged; request ids and request timing, note {i}",
            }
            for i in range(30)
        ]
        + [
            {"external_id": f"misc{i}", "kind": "doc_section", "title": f"misc {i}", "content": f"lunch menu {i}"}
            for i in range(100)
        ]
        + [
            {
                "external_id": "patch",
                "kind": "doc_section",
                "title": "Partial updates",
                "content": "send a PATCH with only the changed fields of the request",
            },
            {
                "external_id": "bigfile",
                "kind": "code_file",
                "title": "app.py",
                "path": "app.py",
                "content": "def patch(request):\n    return request\n" * 20,
            },
        ]
    )
    source = _ingest_rows(t, rows)
    scope = scope_for_user(t.admin)
    with tenant_context(t.tenant.pk):
        ids = dict(Document.objects.filter(source=source).values_list("external_id", "pk"))
        terms = query_terms("patch request", scope)
        assert terms.idf("patch") > terms.idf("request") > 0
        ranked = lexical_ranking("patch request", scope, terms=terms)
        assert ranked[0] == ids["patch"]
        assert ids["bigfile"] not in ranked
        assert lexical_ranking("patch request", scope, terms=terms, kinds=["code_file"]) == [ids["bigfile"]]
        mixed = lexical_ranking("patch request", scope, terms=terms, kinds=["code_file", "doc_section"])
        assert ids["bigfile"] not in mixed
        with pytest.raises(ValueError, match="scoring"):
            lexical_ranking("patch request", scope, terms=terms, scoring="bm99")


def test_asked_kinds_read_the_question_shape():
    from search.retrieval import asked_symbol_kinds

    assert asked_symbol_kinds("Which error is raised when a message fails validation?") == ("class",)
    assert asked_symbol_kinds("Which route class handles websockets?") == ("class",)
    assert asked_symbol_kinds("Which helper function parses dates?") == ("function", "method")
    assert asked_symbol_kinds("How do I deploy?") == ()


@pytest.mark.django_db
def test_code_named_in_the_best_docs_is_followed_to_its_definition(make_tenant, settings):
    """A question describing behaviour in the docs' words reaches the class the docs name in
    backticks (the 'linked:code' ranking); a name the docs mention that no code defines leads
    nowhere; another tenant's definition of the same name is never reached."""
    from kbportal.tenancy import tenant_context
    from sources.models import Document

    settings.KB_CUSTOM_CONNECTORS = {"test_rows": "tests.search.rows_connector.RowsConnector"}

    def code_row(ext, symbol, kind, code):
        return {
            "external_id": ext,
            "kind": "code_chunk",
            "title": f"tasks.py: {symbol}",
            "path": "tasks.py",
            "content": code,
            "start_line": 1,
            "end_line": 3,
            "metadata": {"symbol": symbol, "symbol_kind": kind},
        }

    rows = [
        {
            "external_id": "guide",
            "kind": "doc_section",
            "title": "Work after the reply",
            "content": "To run work once the reply has gone out, add it to a `Deferred` queue; see also `Missing`.",
        },
        code_row("deferred", "Deferred", "class", "class Deferred:\n    items = []"),
        code_row("other", "Ledger", "class", "class Ledger:\n    rows = []"),
    ] + [
        {"external_id": f"note{i}", "kind": "doc_section", "title": f"note {i}", "content": f"lunch menu {i}"}
        for i in range(40)
    ]
    t = make_tenant("linked")
    source = _ingest_rows(t, rows, name="Repo")
    other = make_tenant("linked-other")
    _ingest_rows(other, [code_row("deferred", "Deferred", "class", "class Deferred:\n    secret = 1")], name="Repo")

    scope = scope_for_user(t.admin)
    hits = hybrid_search("Which class runs work once the reply has gone out?", scope, limit=20).hits
    with tenant_context(t.tenant.pk):
        deferred = Document.objects.get(source=source, external_id="deferred").pk
    linked = [h for h in hits if "linked:code" in h.ranks]
    assert [h.document_id for h in linked] == [deferred]
    assert all(h.source_id == source.pk for h in hits)
