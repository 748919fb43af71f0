"""Shared text patterns: Unicode words, content terms, identifiers the question names, citations."""

import pytest

from search.text import content_terms, holds_term, neutralize_citations, specific_terms, without_citations


def test_content_terms_keep_non_ascii_words_whole():
    terms = content_terms("Wie viele Bienenstöcke hat São Paulo?")
    assert "bienen" in terms  # stem of "Bienenstöcke", not "bienenst" + "cke"
    assert "cke" not in terms and "bienenst" not in terms
    assert "são" in terms


def test_content_terms_keep_dates_versions_and_ids_whole():
    assert {"6/1", "eu-west-3", "v2.2.3"} <= content_terms("Go live 6/1 for eu-west-3 on v2.2.3.")


@pytest.mark.parametrize(
    ("question", "expected"),
    [
        ("What is ZEBRA-4471?", ["ZEBRA-4471"]),
        ("How do I enable HTTP/3 in FastAPI's server?", ["HTTP/3", "FastAPI"]),
        ("How is `kv_crc` computed for H100/A100 nodes in CSRL?", ["kv_crc", "H100", "A100", "CSRL"]),
        ('Why does "connection reset by peer" appear?', ["connection reset by peer"]),
        ("What does _should_embed_body_fields decide?", ["_should_embed_body_fields"]),
        # numbers, however written, are not identifiers; plain words are not either
        ("Which 401s came after v2.2.x on Python 3.12?", []),
        ("How do I deploy the billing service?", []),
    ],
)
def test_specific_terms_are_the_identifiers_a_question_names(question, expected):
    assert specific_terms(question) == expected


def test_specific_terms_without_acronyms_leave_words_in_capitals_out():
    assert specific_terms("Where is the PR that adds the README for ZEBRA-4471?", acronyms=False) == ["ZEBRA-4471"]


@pytest.mark.parametrize(
    ("text", "term", "held"),
    [
        ("the ticket zebra 4471 was closed", "ZEBRA-4471", True),
        ("templates = Jinja2Templates(directory='t')", "Jinja2", True),
        ("def _should_embed_body_fields(fields):", "_should_embed_body_fields", True),
        ("uses kv-crc checksums", "kv_crc", True),
        ("HTTP/2 is supported by Hypercorn", "HTTP/3", False),
        ("ZEBRA-44710 is another ticket", "ZEBRA-4471", False),
        ("jinja2x", "Jinja2", False),
    ],
)
def test_holds_term_matches_whole_tokens_and_identifier_prefixes(text, term, held):
    assert holds_term(text, term) is held


def test_document_citations_are_neutralised_and_removed():
    assert neutralize_citations("see [3] and [1, 2]") == "see (3) and (1, 2)"
    assert "[" not in without_citations("done [1].") and without_citations("done [1].").startswith("done ")
