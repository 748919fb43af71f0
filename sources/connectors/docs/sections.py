"""Splitting one page into heading sections: Markdown, HTML, reStructuredText and plain text.

Every parser returns a :class:`ParsedPage`: the page text, its title (first level-1 heading) and
a list of :class:`RawSection` (a heading, or ``None`` for text before the first heading, plus
its :class:`Block` s). A block is one paragraph-level unit (a paragraph, a list, a code fence, a
table, a heading) with its 1-based line range in the source file, so a long section can be split
between blocks and a code fence is only ever cut when it alone is longer than the limit.

Block texts keep the blank lines that follow them, so ``"\\n".join(block.text ...)`` gives back
the exact source slice for Markdown, reST and plain text (HTML: the extracted text, paragraphs
separated by a blank line).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import yaml
from bs4 import BeautifulSoup
from bs4.element import Comment, Declaration, Doctype, NavigableString, ProcessingInstruction, Tag
from django.utils.text import slugify
from markdown_it import MarkdownIt

# CommonMark plus tables: the parser knows fenced and indented code, setext headings, HTML
# blocks and block quotes, so a "# comment" inside a code fence is never taken for a heading.
_MARKDOWN = MarkdownIt("commonmark").enable("table")

# A trailing attribute list, as written by MkDocs' attr_list / Pandoc: "Title { #anchor .cls }".
_ATTR_LIST = re.compile(r"\s*\{\s*([#.][^{}]*|[^{}]*=[^{}]*)\}\s*$")
_ATTR_ID = re.compile(r"#([\w\-:.]+)")

_RST_ADORNMENT = re.compile(r"^([!-/:-@\[-`{-~])\1{2,}\s*$")

_HTML_HEADINGS = {"h1": 1, "h2": 2, "h3": 3, "h4": 4, "h5": 5, "h6": 6}
_HTML_BLOCKS = {
    "address",
    "article",
    "aside",
    "blockquote",
    "br",
    "dd",
    "details",
    "div",
    "dl",
    "dt",
    "fieldset",
    "figcaption",
    "figure",
    "footer",
    "form",
    "header",
    "hr",
    "li",
    "main",
    "nav",
    "ol",
    "p",
    "pre",
    "section",
    "summary",
    "table",
    "tr",
    "ul",
}
_HTML_SKIP = {"head", "script", "style", "noscript", "template", "svg", "iframe", "object"}


@dataclass
class Heading:
    """A heading: level 1-6 (reST: order of first appearance), plain text, URL fragment."""

    level: int
    text: str
    anchor: str


@dataclass
class Block:
    """A paragraph-level unit; lines are 1-based and inclusive, ``text`` keeps trailing blank lines."""

    start_line: int
    end_line: int
    text: str
    is_heading: bool = False


@dataclass
class RawSection:
    """A heading (``None``: text before the first heading) and its blocks, heading block first."""

    heading: Heading | None
    blocks: list[Block] = field(default_factory=list)
    merged_headings: list[str] = field(default_factory=list)
    heading_path: list[str] = field(default_factory=list)

    @property
    def body_chars(self) -> int:
        """Characters of non-blank body text (headings excluded)."""
        return sum(len(b.text.strip()) for b in self.blocks if not b.is_heading)


@dataclass
class ParsedPage:
    """A parsed page: ``text`` is what the page row stores; ``title`` is ``None`` when unknown."""

    format: str
    text: str
    title: str | None
    sections: list[RawSection]


def render(blocks: list[Block]) -> str:
    """The text of consecutive blocks (the exact source slice for line-based formats)."""
    return "\n".join(b.text for b in blocks).strip("\n")


def slug(text: str) -> str:
    """URL-fragment slug of a heading text (Unicode kept, as MkDocs and GitHub do)."""
    return slugify(text, allow_unicode=True)[:80]


def split_attr_list(text: str) -> tuple[str, str | None]:
    """``"Title { #anchor }"`` -> ``("Title", "anchor")``; no attribute list -> ``(text, None)``."""
    match = _ATTR_LIST.search(text)
    if not match:
        return text, None
    ids = _ATTR_ID.findall(match.group(1))
    return text[: match.start()].rstrip(), (ids[0] if ids else None)


def parse_page(fmt: str, text: str) -> ParsedPage:
    """Parse ``text`` (newlines already normalised to ``\\n``) as ``fmt``: markdown, html, rst or text."""
    if fmt == "markdown":
        return _parse_markdown(text)
    if fmt == "html":
        return _parse_html(text)
    if fmt == "rst":
        return _parse_rst(text)
    return _parse_plain(text)


def _sections_from_blocks(blocks: list[tuple[Block, Heading | None]]) -> list[RawSection]:
    """Group blocks into sections: each heading block opens one; leading blank-only text is dropped."""
    sections: list[RawSection] = [RawSection(heading=None)]
    for block, heading in blocks:
        if heading is not None:
            sections.append(RawSection(heading=heading, blocks=[block]))
        else:
            sections[-1].blocks.append(block)
    if not sections[0].blocks or not render(sections[0].blocks).strip():
        sections.pop(0)
    return sections


def _line_blocks(lines: list[str], starts: list[int], end: int) -> list[tuple[int, int, str]]:
    """(start, end, text) for blocks starting at 0-based ``starts``; each runs to the next start.

    ``end`` is 1-based inclusive and trimmed of trailing blank lines; ``text`` keeps them.
    """
    out = []
    for k, start in enumerate(starts):
        stop = starts[k + 1] if k + 1 < len(starts) else end
        last = stop
        while last > start + 1 and not lines[last - 1].strip():
            last -= 1
        out.append((start + 1, last, "\n".join(lines[start:stop])))
    return out


# --- Markdown ---------------------------------------------------------------------------------


def _front_matter(lines: list[str]) -> tuple[int, str | None]:
    """Number of lines taken by a leading YAML front matter block, and its ``title`` if any."""
    if not lines or lines[0].strip() != "---":
        return 0, None
    for i in range(1, min(len(lines), 500)):
        if lines[i].strip() in ("---", "..."):
            title = None
            try:
                data = yaml.safe_load("\n".join(lines[1:i]))
            except yaml.YAMLError:
                data = None
            if isinstance(data, dict) and isinstance(data.get("title"), str):
                title = data["title"].strip() or None
            return i + 1, title
    return 0, None  # an opening "---" never closed is a thematic break, not front matter


def _inline_text(inline) -> str:
    """Plain text of a heading's inline token: emphasis and code marks dropped, tags dropped."""
    parts: list[str] = []
    for child in inline.children or []:
        if child.type in ("text", "code_inline", "image"):
            parts.append(child.content)
        elif child.type in ("softbreak", "hardbreak"):
            parts.append(" ")
    return " ".join("".join(parts).split())


def _parse_markdown(text: str) -> ParsedPage:
    lines = text.split("\n")
    skip, front_title = _front_matter(lines)
    # Blank the front matter instead of cutting it, so token line numbers are file line numbers.
    source = "\n".join([""] * skip + lines[skip:])
    tokens = _MARKDOWN.parse(source)
    headings: dict[int, Heading] = {}
    starts: list[int] = []
    for i, token in enumerate(tokens):
        # Only top-level blocks structure the page: a "# x" inside a quote or list item does not.
        if token.level != 0 or token.map is None or token.nesting == -1:
            continue
        if not starts or token.map[0] > starts[-1]:
            starts.append(token.map[0])
        if token.type == "heading_open":
            label, anchor = split_attr_list(_inline_text(tokens[i + 1]))
            label = label or "(untitled)"
            headings[token.map[0]] = Heading(level=int(token.tag[1]), text=label, anchor=anchor or slug(label))
    blocks = [
        (Block(start, end, body, is_heading=(start - 1) in headings), headings.get(start - 1))
        for start, end, body in _line_blocks(lines, starts, len(lines))
    ]
    title = next((h.text for h in headings.values() if h.level == 1), None) or front_title
    return ParsedPage("markdown", "\n".join(lines[skip:]).strip("\n"), title, _sections_from_blocks(blocks))


# --- HTML -------------------------------------------------------------------------------------


class _HtmlCollector:
    """Accumulates the text of an HTML body into blocks, opening a section at each h1-h6."""

    def __init__(self) -> None:
        self.blocks: list[tuple[Block, Heading | None]] = []
        self.pieces: list[str] = []
        self.line = 1
        self.block_line = 1

    def text(self, value: str, *, pre: bool) -> None:
        if not self.pieces:
            self.block_line = self.line
        # Outside <pre>, HTML collapses whitespace; inside, the layout is the content.
        self.pieces.append(value if pre else re.sub(r"\s+", " ", value))

    def flush(self) -> None:
        body = "".join(self.pieces).strip()
        self.pieces = []
        if body:
            self.blocks.append((Block(self.block_line, self.block_line, body + "\n"), None))

    def heading(self, level: int, label: str, anchor: str | None, line: int) -> None:
        self.flush()
        label = label or "(untitled)"
        head = Heading(level=level, text=label, anchor=anchor or slug(label))
        self.blocks.append((Block(line, line, label + "\n", is_heading=True), head))


def _parse_html(text: str) -> ParsedPage:
    soup = BeautifulSoup(text, "html.parser")
    root = soup.body or soup
    collector = _HtmlCollector()
    pre_depth = 0
    # Iterative walk: deeply nested markup must not hit Python's recursion limit.
    stack: list[tuple[str, object]] = [("enter", child) for child in reversed(list(root.children))]
    while stack:
        action, node = stack.pop()
        if action == "exit":
            assert isinstance(node, Tag)
            if node.name == "pre":
                pre_depth -= 1
            if node.name in _HTML_BLOCKS:
                collector.flush()
            continue
        if isinstance(node, Comment | Declaration | Doctype | ProcessingInstruction):
            continue
        if isinstance(node, NavigableString):
            collector.text(str(node), pre=pre_depth > 0)
            continue
        if not isinstance(node, Tag) or node.name in _HTML_SKIP:
            continue
        if node.sourceline:
            collector.line = node.sourceline
        if node.name in _HTML_HEADINGS:
            anchor = node.get("id")
            collector.heading(
                _HTML_HEADINGS[node.name],
                " ".join(node.get_text(" ").split()),
                anchor if isinstance(anchor, str) else None,
                collector.line,
            )
            continue
        if node.name in _HTML_BLOCKS:
            collector.flush()
        if node.name in ("td", "th"):
            collector.text(" ", pre=False)
        if node.name == "pre":
            pre_depth += 1
        stack.append(("exit", node))
        stack.extend(("enter", child) for child in reversed(list(node.children)))
    collector.flush()
    # A block runs until the line before the next one starts (tags carry no end line).
    last_line = max(len(text.rstrip("\n").split("\n")), 1)
    blocks = collector.blocks
    for k, (block, _) in enumerate(blocks):
        following = blocks[k + 1][0].start_line - 1 if k + 1 < len(blocks) else last_line
        block.end_line = max(block.start_line, following)
    title = next((h.text for _, h in blocks if h and h.level == 1), None)
    if title is None and soup.title and soup.title.get_text(strip=True):
        title = " ".join(soup.title.get_text(" ").split())
    page_text = render([b for b, _ in blocks])
    return ParsedPage("html", page_text, title, _sections_from_blocks(blocks))


# --- reStructuredText and plain text ----------------------------------------------------------


def _paragraph_starts(lines: list[str], begin: int, end: int) -> list[int]:
    """0-based first lines of blank-line-separated paragraphs in ``lines[begin:end]``."""
    return [i for i in range(begin, end) if lines[i].strip() and (i == begin or not lines[i - 1].strip())]


def _parse_rst(text: str) -> ParsedPage:
    lines = text.split("\n")
    styles: list[tuple[str, bool]] = []  # reST levels follow the order adornment styles first appear
    found: list[tuple[int, int, Heading]] = []  # (first line, line after, heading), 0-based
    i = 0
    while i < len(lines):
        line = lines[i]
        over = _RST_ADORNMENT.match(line)
        if (
            over
            and i + 2 < len(lines)
            and lines[i + 1].strip()
            and (under := _RST_ADORNMENT.match(lines[i + 2]))
            and under.group(1) == over.group(1)
        ):
            label, style, span = lines[i + 1].strip(), (over.group(1), True), 3
        elif (
            line.strip()
            and not line[0].isspace()
            and not over
            and (i == 0 or not lines[i - 1].strip())
            and i + 1 < len(lines)
            and (under := _RST_ADORNMENT.match(lines[i + 1]))
        ):
            label, style, span = line.strip(), (under.group(1), False), 2
        else:
            i += 1
            continue
        if style not in styles:
            styles.append(style)
        found.append((i, i + span, Heading(level=min(styles.index(style) + 1, 6), text=label, anchor=slug(label))))
        i += span
    starts: list[int] = []
    heads: dict[int, Heading] = {}
    cursor = 0
    for first, after, head in found:
        starts += _paragraph_starts(lines, cursor, first) + [first]
        heads[first] = head
        cursor = after
    starts += _paragraph_starts(lines, cursor, len(lines))
    blocks = [
        (Block(start, end, body, is_heading=(start - 1) in heads), heads.get(start - 1))
        for start, end, body in _line_blocks(lines, starts, len(lines))
    ]
    title = next((h.text for _, _, h in found if h.level == 1), None)
    return ParsedPage("rst", text.strip("\n"), title, _sections_from_blocks(blocks))


def _parse_plain(text: str) -> ParsedPage:
    lines = text.split("\n")
    starts = _paragraph_starts(lines, 0, len(lines))
    blocks: list[tuple[Block, Heading | None]] = [
        (Block(start, end, body), None) for start, end, body in _line_blocks(lines, starts, len(lines))
    ]
    return ParsedPage("text", text.strip("\n"), None, _sections_from_blocks(blocks))
