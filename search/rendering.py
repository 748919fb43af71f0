"""An answer's text as safe HTML: its Markdown rendered, every ``[n]`` a link to source ``n``.

The answer is untrusted (an LLM's words, quoted documents), so the HTML markdown-it-py renders
(CommonMark, raw HTML disabled: a ``<script>`` in the answer stays text) is cleaned again by
nh3 (Ammonia) to an allow-list of tags and attributes, with links limited to http(s), mailto
and the page's own ``#source-n`` anchors.
"""

from __future__ import annotations

import re

import nh3
from django.utils.safestring import SafeString, mark_safe
from markdown_it import MarkdownIt

_MARKDOWN = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False})
ALLOWED_TAGS = {"p", "br", "ul", "ol", "li", "strong", "em", "code", "pre", "blockquote", "a", "h3", "h4", "hr"}
ALLOWED_ATTRIBUTES = {"a": {"href", "class", "data-n"}, "code": {"class"}}
_CITED = re.compile(r"\[(\d{1,3})\]")
_CODE = re.compile(r"(<pre>.*?</pre>|<code>.*?</code>)", re.S)


def _link_citations(html: str) -> str:
    """``[n]`` outside code becomes a link to ``#source-n`` (the sources list's item)."""
    parts = _CODE.split(html)
    for i in range(0, len(parts), 2):  # even parts are outside <pre>/<code>
        parts[i] = _CITED.sub(lambda m: f'<a class="cite" href="#source-{m[1]}" data-n="{m[1]}">[{m[1]}]</a>', parts[i])
    return "".join(parts)


def answer_html(text: str) -> SafeString:
    """``text`` (Markdown with ``[n]`` citations) as sanitised HTML, safe to insert in a page."""
    html = _link_citations(_MARKDOWN.render(text or ""))
    clean = nh3.clean(
        html,
        tags=ALLOWED_TAGS,
        attributes=ALLOWED_ATTRIBUTES,
        url_schemes={"http", "https", "mailto"},
        link_rel="noopener noreferrer",
    )
    return mark_safe(clean)  # noqa: S308 - cleaned by nh3 just above
