"""An answer's text as safe HTML: its Markdown rendered, each citation ``[n]`` a link to source ``n``.

The answer is untrusted (an LLM's words, quoted documents), so the HTML markdown-it-py renders
(CommonMark, raw HTML disabled: a ``<script>`` in the answer stays text) is cleaned again by
nh3 (Ammonia) to an allow-list of tags and attributes, with links limited to http(s), mailto
and the page's own ``#source-n`` anchors. Only a citation written as such (``[3]`` in the
answer's own text, outside code, and a number the answer cites) becomes a link: a ``[3]`` made
of entities (``&#91;3&#93;``) or escapes (``[3\\]``), or one inside code, stays text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import nh3
from django.utils.safestring import SafeString, mark_safe
from markdown_it import MarkdownIt
from markdown_it.token import Token

# text_join off: text decoded from entities and escapes stays in tokens of its own, so a citation
# in a "text" token is one the answer wrote.
_MARKDOWN = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False}).disable("text_join")
ALLOWED_TAGS = {"p", "br", "ul", "ol", "li", "strong", "em", "code", "pre", "blockquote", "a", "h3", "h4", "hr"}
ALLOWED_ATTRIBUTES = {"a": {"href", "class", "data-n"}, "code": {"class"}}
_CITED = re.compile(r"\[(\d{1,3})\]")
VERIFIED_ANCHOR = "v-source-"  # a verified answer's citations, beside the fresh answer's "source-"


def _with_citation_links(children: list[Token], cited: set[int], anchor: str) -> list[Token]:
    out: list[Token] = []
    for child in children:
        if child.type == "text_special":  # decoded from an entity or an escape: plain text, never a citation
            out.append(Token("text", "", 0, content=child.content))
            continue
        if child.type != "text" or "[" not in child.content:
            out.append(child)
            continue
        pos = 0
        for match in _CITED.finditer(child.content):
            n = int(match.group(1))
            if n not in cited:
                continue
            if match.start() > pos:
                out.append(Token("text", "", 0, content=child.content[pos : match.start()]))
            link = f'<a class="cite" href="#{anchor}{n}" data-n="{n}">[{n}]</a>'
            out.append(Token("html_inline", "", 0, content=link))
            pos = match.end()
        if pos < len(child.content):
            out.append(Token("text", "", 0, content=child.content[pos:]))
    return out


def answer_html(text: str, cited: Iterable[int] = (), *, anchor: str = "source-") -> SafeString:
    """``text`` (Markdown with ``[n]`` citations) as sanitised HTML, safe to insert in a page;
    each ``[n]`` with ``n`` in ``cited`` links to ``#<anchor>n`` (``anchor``: letters, digits and
    "-" only; several answers on one page each take their own)."""
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9-]*", anchor):
        raise ValueError(f"anchor: letters, digits and '-' only, not {anchor!r}")
    numbers = set(cited)
    tokens = _MARKDOWN.parse(text or "")
    for token in tokens:
        if token.type == "inline" and token.children:
            token.children = _with_citation_links(token.children, numbers, anchor)
    html = _MARKDOWN.renderer.render(tokens, _MARKDOWN.options, {})
    clean = nh3.clean(
        html,
        tags=ALLOWED_TAGS,
        attributes=ALLOWED_ATTRIBUTES,
        url_schemes={"http", "https", "mailto"},
        link_rel="noopener noreferrer",
    )
    return mark_safe(clean)  # noqa: S308 - cleaned by nh3 just above


# CommonMark's backslash escapes (spec 0.31, section 2.4: a backslash before ASCII punctuation), and
# what keeps them literal: fenced code blocks and code spans.
_BACKSLASH_ESCAPE = re.compile(r"\\([!-/:-@\[-`{-~])")
_LITERAL = re.compile(r"^[ ]{0,3}(`{3,}|~{3,})[^\n]*\n.*?^[ ]{0,3}\1[ \t]*$|(`+)(?:(?!\2).)+?\2", re.M | re.S)


def answer_terminal_text(text: str) -> str:
    """An answer's Markdown as a terminal shows it: backslash escapes written so that Markdown shows
    a name as written (``shown\\_path``, ``\\*args``) printed as the name (``shown_path``), except
    inside code spans and fenced code, where they are what the code says. Everything else (code
    fences, ``[n]`` citations, list markers) is left as written: it reads as plain text."""
    out: list[str] = []
    pos = 0
    for match in _LITERAL.finditer(text):
        out.append(_BACKSLASH_ESCAPE.sub(r"\1", text[pos : match.start()]))
        out.append(match.group(0))
        pos = match.end()
    out.append(_BACKSLASH_ESCAPE.sub(r"\1", text[pos:]))
    return "".join(out)
