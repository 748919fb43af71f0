"""Server-sent events of an answer in the making, as the web page's stream and the API send them."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

from search.rendering import VERIFIED_ANCHOR, answer_html
from search.services import AskEvent

logger = logging.getLogger(__name__)


def server_sent_events(events: Iterator[AskEvent]) -> Iterator[str]:
    """Each event as ``event: <type>`` + ``data: <one-line JSON>``; the ``done`` event also carries
    ``html``, the answer rendered and sanitised (``search.rendering.answer_html``), and a verified
    answer its own ``html`` (citations to ``#v-source-n``). A failure
    mid-way is a final ``failed`` event (not ``error``, which browsers' EventSource also uses for
    network errors)."""
    try:
        for event in events:
            data = event.data
            if event.type == "done":
                data = {**data, "html": str(answer_html(data.get("text", ""), data.get("cited") or ()))}
                verified = data.get("verified")
                if isinstance(verified, dict):
                    cited = [s["n"] for s in verified.get("sources") or [] if isinstance(s.get("n"), int)]
                    html = answer_html(verified.get("text", ""), cited, anchor=VERIFIED_ANCHOR)
                    data["verified"] = {**verified, "html": str(html)}
            yield f"event: {event.type}\ndata: {json.dumps(data, default=str)}\n\n"
    except Exception:
        logger.exception("the answer stream failed")
        yield 'event: failed\ndata: {"message": "the answer failed; please try again"}\n\n'
