"""Splits one source file into retrievable chunks along its language's boundaries, coarse to fine.

- A class of at most ``SMALL_CLASS_LINES`` lines is one chunk. A larger class becomes a header
  chunk (decorators, signature, docstring, the attributes before the first method) followed by
  one chunk per method (recursively for nested classes); statements between methods are
  grouped into ``<Class>.<body>`` blocks.
- A function or method is one chunk; one longer than ``LONG_FUNCTION_LINES`` is split into
  parts of about ``BLOCK_LINES`` lines at statement boundaries (``symbol:1``, ``symbol:2``...).
- Module-level code between definitions is grouped into ``<module>`` blocks of about
  ``BLOCK_LINES`` lines, cut at statement boundaries.
- Comments directly above a definition (no blank line between) belong to it; for JavaScript,
  TypeScript and Go they are its docstring.

Python, JavaScript, TypeScript/TSX and Go are parsed with tree-sitter (a syntax error only
produces ``ERROR`` nodes, which end up in module blocks). Other text files are cut into windows
of about ``BLOCK_LINES`` lines at blank lines.

Every chunk carries a ``key`` that is unique within the file and stable across runs as long as
its symbol exists: the symbol itself, ``symbol~2`` for its second occurrence (a property getter
and setter, a redefinition), ``symbol:N`` for the parts of a long function, and ``L<start>``
only for line windows of files without a grammar. Line numbers are 1-based and inclusive.
"""

from __future__ import annotations

import ast
import inspect
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import PurePosixPath

from tree_sitter import Language, Node, Parser

SMALL_CLASS_LINES = 80  # a class up to this many lines is kept whole
LONG_FUNCTION_LINES = 120  # a function longer than this is split into parts
BLOCK_LINES = 60  # target size of module blocks, function parts and line windows
MAX_SIGNATURE_CHARS = 500

# Extension (lower case, no dot) -> language name, for every text file the connector indexes.
_LANGUAGE_EXTENSIONS = {  # language name -> its file extensions (lower case, no dot)
    "python": "py pyi",
    "javascript": "js mjs cjs jsx",
    "typescript": "ts mts cts",
    "tsx": "tsx",
    "go": "go",
    "rust": "rs",
    "java": "java",
    "kotlin": "kt kts",
    "scala": "scala",
    "ruby": "rb",
    "php": "php",
    "c": "c h",
    "cpp": "cc cpp cxx hpp hh hxx",
    "csharp": "cs",
    "swift": "swift",
    "objc": "m",
    "lua": "lua",
    "perl": "pl pm",
    "r": "r",
    "elixir": "ex exs",
    "erlang": "erl",
    "haskell": "hs",
    "ocaml": "ml",
    "clojure": "clj",
    "dart": "dart",
    "vue": "vue",
    "svelte": "svelte",
    "shell": "sh bash zsh fish",
    "powershell": "ps1",
    "sql": "sql",
    "protobuf": "proto",
    "graphql": "graphql gql",
    "terraform": "tf",
    "hcl": "hcl",
    "starlark": "bzl",
    "gradle": "gradle",
    "html": "html htm",
    "css": "css",
    "scss": "scss",
    "sass": "sass",
    "less": "less",
    "xml": "xml",
    "markdown": "md markdown mdx",
    "rst": "rst",
    "text": "txt in",
    "asciidoc": "adoc",
    "latex": "tex",
    "toml": "toml",
    "yaml": "yaml yml",
    "json": "json jsonc",
    "ini": "cfg ini conf",
    "properties": "properties",
    "dotenv": "env",
    "jinja": "j2 jinja",
}
EXTENSION_LANGUAGES: dict[str, str] = {
    extension: language for language, extensions in _LANGUAGE_EXTENSIONS.items() for extension in extensions.split()
}

# Files without a telling extension that are still worth indexing, by exact name.
FILENAME_LANGUAGES: dict[str, str] = {
    "Makefile": "make",
    "GNUmakefile": "make",
    "Dockerfile": "dockerfile",
    "Containerfile": "dockerfile",
    "Jenkinsfile": "groovy",
    "Vagrantfile": "ruby",
    "Gemfile": "ruby",
    "Rakefile": "ruby",
    "Procfile": "text",
    "LICENSE": "text",
    "COPYING": "text",
    "README": "text",
    "CODEOWNERS": "text",
    "NOTICE": "text",
    "AUTHORS": "text",
    "CHANGELOG": "text",
    ".gitignore": "text",
    ".dockerignore": "text",
    ".gitattributes": "text",
    ".editorconfig": "ini",
}


def language_for(path: str) -> str | None:
    """The language of ``path`` (e.g. ``"python"``, ``"markdown"``), or None when not indexed.

    None means "not a text file we index" (images, archives, lock files without a known
    extension...); the caller ignores those without reporting them.
    """
    name = PurePosixPath(path).name
    if name in FILENAME_LANGUAGES:
        return FILENAME_LANGUAGES[name]
    if name.startswith(("Dockerfile.", "Containerfile.")) or name.endswith(".Dockerfile"):
        return "dockerfile"
    if name.startswith("Makefile."):
        return "make"
    suffix = PurePosixPath(name).suffix.lower().lstrip(".")
    return EXTENSION_LANGUAGES.get(suffix)


@dataclass(frozen=True)
class Chunk:
    """One chunk of a file.

    ``symbol`` is the qualified symbol (``"Router.add_route"``, ``"<module>"``,
    ``"Router.<body>"``) or None for a line window; ``symbol_kind`` is one of ``class``,
    ``function``, ``method``, ``type`` (interface, type alias, enum, Go type), ``block`` (a part
    of a long function, a class body block, a line window) or ``module``. ``code`` is the
    source lines ``start_line..end_line`` (1-based, inclusive). ``signature`` is the header of
    the definition (decorators included), ``enclosing_signature`` that of the class a method
    belongs to, ``members`` the method names of a split class's header chunk, ``part`` the
    1-based part number of a split function.
    """

    key: str
    symbol: str | None
    symbol_kind: str
    start_line: int
    end_line: int
    code: str
    signature: str = ""
    docstring: str = ""
    enclosing_signature: str = ""
    members: tuple[str, ...] = ()
    part: int | None = None


@dataclass
class FileOutline:
    """A chunked file: its language, module docstring, top-level symbols and chunks in order.

    ``top_level`` lists ``(symbol_kind, qualified symbol)`` of the file's top-level definitions
    (Go methods included), for the file's summary.
    """

    language: str
    docstring: str
    top_level: list[tuple[str, str]]
    chunks: list[Chunk]


@dataclass
class _Member:
    """A child of a module or class body: a definition, a comment or any other statement."""

    start: int
    end: int
    kind: str  # "function" | "class" | "type" | "comment" | "decorator" | "statement"
    name: str = ""
    node: Node | None = None  # the definition itself
    outer: Node | None = None  # the definition with its decorators / export keyword
    body: Node | None = None  # the block whose start ends the signature
    receiver: str = ""  # Go: the receiver type of a method
    lead_comments: list[str] = field(default_factory=list)

    @property
    def is_definition(self) -> bool:
        return self.kind in ("function", "class", "type")


def _lines_of(node: Node) -> tuple[int, int]:
    """1-based inclusive line range of ``node``; a node ending at column 0 ends on the line before."""
    start_row, end_row = node.start_point.row, node.end_point.row
    if node.end_point.column == 0 and end_row > start_row:
        end_row -= 1
    return start_row + 1, end_row + 1


def _text(node: Node | None) -> str:
    return node.text.decode("utf-8", "replace") if node is not None and node.text is not None else ""


def _clean_comment(text: str) -> str:
    """A comment's prose: ``/** ... */``, ``// ...`` and ``# ...`` markers removed."""
    text = text.strip()
    if text.startswith("/*"):
        text = re.sub(r"^/\*+|\*+/$", "", text)
        lines = [re.sub(r"^\s*\*? ?", "", line) for line in text.split("\n")]
    else:
        lines = [re.sub(r"^\s*(//+|#+) ?", "", line) for line in text.split("\n")]
    return "\n".join(lines).strip()


def _string_literal(node: Node) -> str:
    """The value of a Python string literal node, dedented like ``inspect.cleandoc``."""
    raw = _text(node)
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        value = raw.strip("rRbBuUfF").strip("\"'")  # an f-string or odd literal: keep its text
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return inspect.cleandoc(value) if isinstance(value, str) else ""


class _Adapter:
    """How one tree-sitter grammar spells modules, classes, functions and docstrings."""

    comment_docstrings = True  # docstring = the comments directly above the definition

    def members(self, container: Node) -> list[_Member]:
        raise NotImplementedError

    def class_body(self, member: _Member) -> Node | None:
        """The node whose named children are the class's members (None: not split)."""
        return member.body if member.kind == "class" else None

    def body_statements(self, member: _Member) -> list[Node]:
        return list(member.body.named_children) if member.body is not None else []

    def docstring(self, member: _Member) -> str:
        return "\n".join(_clean_comment(c) for c in member.lead_comments).strip()

    def module_docstring(self, root: Node) -> str:
        comments: list[str] = []
        for child in root.named_children:
            if child.type != "comment":
                break
            comments.append(_text(child))
        return "\n".join(_clean_comment(c) for c in comments).strip()


class _PythonAdapter(_Adapter):
    comment_docstrings = False

    def members(self, container: Node) -> list[_Member]:
        out = []
        for node in container.named_children:
            start, end = _lines_of(node)
            inner = node.child_by_field_name("definition") if node.type == "decorated_definition" else node
            if inner is not None and inner.type in ("function_definition", "class_definition"):
                kind = "function" if inner.type == "function_definition" else "class"
                name = _text(inner.child_by_field_name("name"))
                body = inner.child_by_field_name("body")
                out.append(_Member(start, end, kind, name, node=inner, outer=node, body=body))
            elif node.type == "comment":
                out.append(_Member(start, end, "comment", node=node))
            else:
                out.append(_Member(start, end, "statement", node=node))
        return out

    def _docstring_of(self, block: Node | None) -> str:
        if block is None:
            return ""
        for child in block.named_children:
            if child.type == "comment":
                continue
            if child.type == "expression_statement" and child.named_child_count == 1:
                literal = child.named_children[0]
                if literal.type in ("string", "concatenated_string"):
                    return _string_literal(literal)
            return ""
        return ""

    def docstring(self, member: _Member) -> str:
        return self._docstring_of(member.body)

    def module_docstring(self, root: Node) -> str:
        return self._docstring_of(root)


class _JavaScriptAdapter(_Adapter):
    """JavaScript, TypeScript and TSX: one grammar family, the same node names."""

    DECLARATIONS = {
        "function_declaration": "function",
        "generator_function_declaration": "function",
        "class_declaration": "class",
        "abstract_class_declaration": "class",
        "interface_declaration": "type",
        "type_alias_declaration": "type",
        "enum_declaration": "type",
    }
    FUNCTION_VALUES = {"arrow_function", "function_expression", "function", "generator_function"}
    CLASS_MEMBERS = {"method_definition"}

    def _definition(self, node: Node) -> tuple[str, str, Node, Node | None] | None:
        """(kind, name, definition node, body) when ``node`` defines a function, class or type."""
        if node.type == "export_statement":
            inner = node.child_by_field_name("declaration") or node.child_by_field_name("value")
            if inner is None:
                return None
            found = self._definition(inner)
            if found is None and inner.type in self.FUNCTION_VALUES | {"class"}:
                kind = "class" if inner.type == "class" else "function"
                return kind, "default", inner, inner.child_by_field_name("body")
            return found
        if node.type in self.DECLARATIONS:
            return (
                self.DECLARATIONS[node.type],
                _text(node.child_by_field_name("name")),
                node,
                node.child_by_field_name("body"),
            )
        if node.type in self.CLASS_MEMBERS:
            return "function", _text(node.child_by_field_name("name")), node, node.child_by_field_name("body")
        if node.type in ("lexical_declaration", "variable_declaration"):
            declarators = [c for c in node.named_children if c.type == "variable_declarator"]
            if len(declarators) != 1:
                return None
            value = declarators[0].child_by_field_name("value")
            name = _text(declarators[0].child_by_field_name("name"))
            if value is not None and value.type in self.FUNCTION_VALUES:
                return "function", name, value, value.child_by_field_name("body")
            if value is not None and value.type == "class":
                return "class", name, value, value.child_by_field_name("body")
        return None

    def members(self, container: Node) -> list[_Member]:
        out = []
        for node in container.named_children:
            start, end = _lines_of(node)
            if node.type in ("comment", "decorator"):
                out.append(_Member(start, end, node.type, node=node))
                continue
            found = self._definition(node)
            if found is None:
                out.append(_Member(start, end, "statement", node=node))
                continue
            kind, name, inner, body = found
            out.append(_Member(start, end, kind, name or "<anonymous>", node=inner, outer=node, body=body))
        return out

    def body_statements(self, member: _Member) -> list[Node]:
        body = member.body
        if body is None or body.type != "statement_block":
            return []  # an expression-bodied arrow function, an interface: cut into windows
        return list(body.named_children)


class _GoAdapter(_Adapter):
    def members(self, container: Node) -> list[_Member]:
        out = []
        for node in container.named_children:
            start, end = _lines_of(node)
            if node.type == "comment":
                out.append(_Member(start, end, "comment", node=node))
            elif node.type in ("function_declaration", "method_declaration"):
                receiver = ""
                if node.type == "method_declaration":
                    receiver = self._receiver_type(node.child_by_field_name("receiver"))
                name = _text(node.child_by_field_name("name"))
                body = node.child_by_field_name("body")
                out.append(_Member(start, end, "function", name, node=node, outer=node, body=body, receiver=receiver))
            elif node.type == "type_declaration" and len(specs := self._type_specs(node)) == 1:
                name = _text(specs[0].child_by_field_name("name"))
                out.append(_Member(start, end, "type", name, node=node, outer=node))
            else:
                out.append(_Member(start, end, "statement", node=node))
        return out

    @staticmethod
    def _type_specs(node: Node) -> list[Node]:
        return [c for c in node.named_children if c.type in ("type_spec", "type_alias")]

    @staticmethod
    def _receiver_type(receiver: Node | None) -> str:
        """``(s *Server[T])`` -> ``Server``: the first type identifier in the receiver."""
        if receiver is None:
            return ""
        stack = [receiver]
        while stack:
            node = stack.pop(0)
            if node.type == "type_identifier":
                return _text(node)
            stack.extend(node.named_children)
        return ""

    def class_body(self, member: _Member) -> Node | None:
        return None  # Go methods live outside their type; a type is one chunk

    def body_statements(self, member: _Member) -> list[Node]:
        if member.body is None:
            return []
        children = list(member.body.named_children)
        if len(children) == 1 and children[0].type == "statement_list":
            return list(children[0].named_children)
        return children

    def module_docstring(self, root: Node) -> str:
        comments: list[str] = []
        for child in root.named_children:
            if child.type == "package_clause":
                return "\n".join(_clean_comment(c) for c in comments).strip()
            comments = comments + [_text(child)] if child.type == "comment" else []
        return ""


_GRAMMARS: dict[str, tuple[str, str]] = {
    # language -> (module, function returning the grammar pointer)
    "python": ("tree_sitter_python", "language"),
    "javascript": ("tree_sitter_javascript", "language"),
    "typescript": ("tree_sitter_typescript", "language_typescript"),
    "tsx": ("tree_sitter_typescript", "language_tsx"),
    "go": ("tree_sitter_go", "language"),
}
_ADAPTERS: dict[str, _Adapter] = {
    "python": _PythonAdapter(),
    "javascript": _JavaScriptAdapter(),
    "typescript": _JavaScriptAdapter(),
    "tsx": _JavaScriptAdapter(),
    "go": _GoAdapter(),
}


@cache
def _language(name: str) -> Language:
    import importlib

    module_name, function = _GRAMMARS[name]
    return Language(getattr(importlib.import_module(module_name), function)())


def _parse(language: str, source: bytes) -> Node:
    # A Parser is cheap and not thread-safe; one per file keeps concurrent runs apart.
    return Parser(_language(language)).parse(source).root_node


def _is_blank(line: str) -> bool:
    return not line.strip()


class _Builder:
    """Accumulates the chunks of one file in source order, handing out unique keys."""

    def __init__(self, text: str, language: str, *, structured: bool = True):
        self.text = text
        self.source = text.encode("utf-8")
        self.lines = text.split("\n")  # tree-sitter counts rows by "\n" only, and so do we
        self.language = language
        self.adapter = _ADAPTERS.get(language) if structured else None
        self.chunks: list[Chunk] = []
        self.top_level: list[tuple[str, str]] = []
        self._key_counts: dict[str, int] = {}
        self._type_signatures: dict[str, str] = {}

    # -- keys, lines, output -------------------------------------------------------------------

    def reserve_key(self, base: str) -> str:
        """``base`` the first time, then ``base~2``, ``base~3``... (stable while order is)."""
        count = self._key_counts.get(base, 0) + 1
        self._key_counts[base] = count
        return base if count == 1 else f"{base}~{count}"

    def trim(self, start: int, end: int) -> tuple[int, int] | None:
        """``start..end`` without leading and trailing blank lines; None when all blank."""
        while start <= end and _is_blank(self.lines[start - 1]):
            start += 1
        while end >= start and _is_blank(self.lines[end - 1]):
            end -= 1
        return (start, end) if start <= end else None

    def emit(self, key: str, symbol: str | None, symbol_kind: str, start: int, end: int, **extra) -> None:
        self.chunks.append(
            Chunk(
                key=key,
                symbol=symbol,
                symbol_kind=symbol_kind,
                start_line=start,
                end_line=end,
                code="\n".join(self.lines[start - 1 : end]),
                **extra,
            )
        )

    def windows(self, start: int, end: int, target: int = BLOCK_LINES) -> list[tuple[int, int]]:
        """``start..end`` cut into windows of about ``target`` lines, at blank lines when possible.

        The cut is the blank line nearest to ``target`` lines in, between half and one and a
        half ``target``; a stretch without blank lines is cut hard at ``target``. A rest of up
        to 1.25 ``target`` stays one window rather than leaving a sliver.
        """
        out: list[tuple[int, int]] = []
        s = start
        while s <= end:
            if end - s + 1 <= target * 5 // 4:
                cut = end
            else:
                ideal = s + target - 1
                blanks = [
                    n for n in range(s + target // 2, min(end, s + target * 3 // 2) + 1) if _is_blank(self.lines[n - 1])
                ]
                cut = min(blanks, key=lambda n: abs(n - ideal)) if blanks else ideal
            if (window := self.trim(s, cut)) is not None:
                out.append(window)
            s = cut + 1
        return out

    def pack(self, spans: list[tuple[int, int]], limit: int = BLOCK_LINES) -> list[tuple[int, int]]:
        """Consecutive spans (statements) grouped into runs of at most ``limit`` lines.

        A group is only cut between statements on different lines; a single statement much
        longer than ``limit`` (a huge literal) is cut into line windows.
        """
        groups: list[tuple[int, int]] = []
        for s, e in spans:
            if groups and (s <= groups[-1][1] or e - groups[-1][0] + 1 <= limit):
                groups[-1] = (groups[-1][0], max(groups[-1][1], e))
            else:
                groups.append((s, e))
        out: list[tuple[int, int]] = []
        for s, e in groups:
            out.extend(self.windows(s, e) if e - s + 1 > limit * 3 // 2 else [(s, e)])
        return out

    # -- structure -----------------------------------------------------------------------------

    def signature(self, member: _Member) -> str:
        """The definition's header: from its decorators to where its body starts."""
        outer = member.outer or member.node
        if outer is None:
            return ""
        if member.body is not None and member.body.start_byte > outer.start_byte:
            raw = self.source[outer.start_byte : member.body.start_byte].decode("utf-8", "replace")
        else:
            raw = self.lines[outer.start_point.row][outer.start_point.column :]
        # Continuation lines lose the definition's own indentation, so a method's decorated
        # signature reads like a top-level one.
        indent = outer.start_point.column
        first, *rest = raw.rstrip().rstrip("{").rstrip().split("\n")
        rest = [line[indent:] if line[:indent].isspace() else line.lstrip() for line in rest]
        return "\n".join([first, *rest])[:MAX_SIGNATURE_CHARS]

    def signature_end(self, member: _Member) -> int:
        """The last line of the definition's header (decorators and signature)."""
        outer = member.outer or member.node
        if outer is None or member.body is None or member.body.start_byte <= outer.start_byte:
            return member.start
        header = self.source[outer.start_byte : member.body.start_byte].decode("utf-8", "replace").rstrip()
        return outer.start_point.row + 1 + header.count("\n")

    def attach_leading_comments(self, members: list[_Member]) -> list[_Member]:
        """Comments (and TS member decorators) directly above a definition become part of it.

        A comment counts only when it starts on its own line (not after code on the previous
        member's last line) and no blank line separates it from what follows.
        """
        out: list[_Member] = []
        for member in members:
            if member.is_definition:
                while (
                    out
                    and out[-1].kind in ("comment", "decorator")
                    and out[-1].end >= member.start - 1
                    and (len(out) < 2 or out[-2].end < out[-1].start)
                ):
                    lead = out.pop()
                    member.start = lead.start
                    if lead.kind == "comment":
                        member.lead_comments.insert(0, _text(lead.node))
            out.append(member)
        return out

    def walk(self, members: list[_Member], prefix: str, enclosing_signature: str) -> None:
        """Chunk ``members`` of a module (``prefix == ""``) or of a split class named ``prefix``."""
        pending: list[_Member] = []
        for member in members:
            if not member.is_definition:
                pending.append(member)
                continue
            self.flush_statements(pending, prefix)
            pending = []
            self.definition(member, prefix, enclosing_signature)
        self.flush_statements(pending, prefix)

    def flush_statements(self, statements: list[_Member], prefix: str) -> None:
        """Statements between definitions -> ``<module>`` / ``Class.<body>`` blocks."""
        if not statements:
            return
        symbol = f"{prefix}.<body>" if prefix else "<module>"
        kind = "block" if prefix else "module"
        for s, e in self.pack([(m.start, m.end) for m in statements]):
            if (span := self.trim(s, e)) is not None:
                self.emit(self.reserve_key(symbol), symbol, kind, *span)

    def definition(self, member: _Member, prefix: str, enclosing_signature: str) -> None:
        assert self.adapter is not None
        if member.receiver:  # a Go method: qualified by its receiver type, wherever it is
            qualified, kind = f"{member.receiver}.{member.name}", "method"
            enclosing_signature = self._type_signatures.get(member.receiver, "")
        else:
            qualified = f"{prefix}.{member.name}" if prefix else member.name
            kind = "method" if member.kind == "function" and prefix else member.kind
        if not prefix:
            self.top_level.append((kind, qualified))
        signature = self.signature(member)
        docstring = self.adapter.docstring(member)
        key = self.reserve_key(qualified)
        common = dict(signature=signature, docstring=docstring, enclosing_signature=enclosing_signature)
        length = member.end - member.start + 1
        class_body = self.adapter.class_body(member)
        if member.kind == "class" and class_body is not None and length > SMALL_CLASS_LINES:
            self.split_class(member, class_body, qualified, key, common)
        elif length <= (SMALL_CLASS_LINES if member.kind == "class" else LONG_FUNCTION_LINES):
            self.emit(key, qualified, kind, member.start, member.end, **common)
        else:
            self.split_function(member, qualified, key, common)

    def split_class(self, member: _Member, body: Node, qualified: str, key: str, common: dict) -> None:
        """Header chunk (signature, docstring, leading attributes), then the members recursively."""
        assert self.adapter is not None
        members = self.attach_leading_comments(self.adapter.members(body))
        first_def = next((i for i, m in enumerate(members) if m.is_definition), len(members))
        leading, rest = members[:first_def], members[first_def:]
        groups = self.pack([(member.start, self.signature_end(member))] + [(m.start, m.end) for m in leading])
        header_end = groups[0][1]
        names = tuple(dict.fromkeys(m.name for m in members if m.is_definition))  # getter+setter: once
        self.emit(key, qualified, "class", member.start, header_end, members=names, **common)
        body_symbol = f"{qualified}.<body>"
        for s, e in groups[1:]:
            if (span := self.trim(s, e)) is not None:
                self.emit(self.reserve_key(body_symbol), body_symbol, "block", *span)
        self.walk(rest, qualified, common["signature"])

    def split_function(self, member: _Member, qualified: str, key: str, common: dict) -> None:
        """Parts of about ``BLOCK_LINES`` lines cut between the body's statements."""
        assert self.adapter is not None
        statements = self.adapter.body_statements(member)
        if statements:
            spans = [(member.start, self.signature_end(member))] + [_lines_of(s) for s in statements]
            groups = self.pack(spans)
            groups[-1] = (groups[-1][0], member.end)  # the closing brace belongs to the last part
            groups[0] = (member.start, groups[0][1])
        else:
            groups = self.windows(member.start, member.end)
        for part, (s, e) in enumerate(groups, start=1):
            self.emit(f"{key}:{part}", qualified, "block", s, e, part=part, **common)

    def run(self) -> tuple[str, list[Chunk], list[tuple[str, str]]]:
        """Chunk the whole file: (module docstring, chunks, top-level symbols)."""
        if self.adapter is None:
            for s, e in self.windows(1, len(self.lines)):
                self.emit(f"L{s}", None, "block", s, e)
            return "", self.chunks, []
        root = _parse(self.language, self.source)
        members = self.attach_leading_comments(self.adapter.members(root))
        for member in members:
            if member.kind in ("type", "class"):
                self._type_signatures.setdefault(member.name, self.signature(member))
        self.walk(members, "", "")
        return self.adapter.module_docstring(root), self.chunks, self.top_level


def chunk_file(path: str, text: str, *, structured: bool = True) -> FileOutline:
    """Chunk ``text``, the content of ``path`` (POSIX path inside the repository).

    ``text`` should use ``"\\n"`` line ends. Returns the file's :class:`FileOutline`; chunks
    are in source order and do not overlap. Never raises for malformed source: a syntax error
    only yields coarser chunks. A file of an unknown language, or any file when ``structured``
    is False, is cut into line windows.
    """
    language = language_for(path) or "text"
    if not text.strip():
        return FileOutline(language=language, docstring="", top_level=[], chunks=[])
    docstring, chunks, top_level = _Builder(text, language, structured=structured).run()
    return FileOutline(language=language, docstring=docstring, top_level=top_level, chunks=chunks)
