"""The search services every surface calls (``search.services.evidence_search``, ``experts_find``):
their inputs are checked by name, and nothing is run for a request they cannot honour."""

import pytest

from search.services import evidence_search, experts_find
from search.tools.people import who_knows
from sources.selectors import scope_for_user


@pytest.mark.django_db
def test_a_kind_filter_is_refused_for_a_tool_that_cannot_apply_it(kb):
    """Only the general search filters by kind: asking another tool for kinds would return rows of
    any kind while the audit log records the filter, so it is refused, naming the input."""
    scope = scope_for_user(kb.acme.admin)
    with pytest.raises(ValueError, match="kinds: only the search tool"):
        evidence_search(
            scope=scope, query="invoices stuck in pending", limit=5, tool="search_slack", kinds=["doc_section"]
        )
    hits = evidence_search(scope=scope, query="invoices stuck in pending", limit=5, kinds=["thread"])
    assert hits and {ev.kind for ev in hits} == {"thread"}


@pytest.mark.django_db
@pytest.mark.parametrize("service", [evidence_search, experts_find])
def test_a_negative_limit_is_refused_by_name(kb, service):
    with pytest.raises(ValueError, match="limit: must be 0 or more, not -1"):
        service(scope=scope_for_user(kb.acme.admin), query="invoices stuck in pending", limit=-1)


@pytest.mark.django_db
def test_who_knows_with_no_room_names_nobody(kb):
    scope = scope_for_user(kb.acme.admin)
    assert who_knows(query="invoices stuck in pending", scope=scope, limit=5)
    assert who_knows(query="invoices stuck in pending", scope=scope, limit=0) == []
    assert who_knows(query="invoices stuck in pending", scope=scope, limit=-3) == []
