"""``search_code``: ripgrep over the indexed code, hits mapped onto chunks, fused with hybrid code search.

Where grep runs: a checkout of exactly what was indexed, kept per data source under
``KB_WORKDIR/checkouts/<source public id>/tree`` and written from the source's ``code_file``
rows (their ``content`` is the file as the git connector read it at the indexed commit: UTF-8,
BOM dropped, CRLF as LF). Why not the repository itself, or ``git grep <commit>``:

- the indexed commit is not recorded anywhere a query can trust (the rows record each file's
  blob, not the commit; a bare clone under ``var/`` is fetched past it on the next run, a local
  work tree moves on with every checkout), while the rows are the index by definition;
- the line numbers grep reports then match the rows' line ranges exactly (the same decoded
  text the chunker numbered), which a CRLF or BOM file in the repository would not;
- the checkout holds only files the connector indexed, so the source's include/exclude globs,
  ``max_file_bytes`` and the binary/undecodable skips apply by construction (the globs are
  checked again at query time, in case they changed since the last run);
- it works wherever the web process runs (the repository may live on the worker's disk only)
  and for any source that yields ``code_file`` rows, not only git.

The checkout is refreshed on demand: each query compares the rows' ``(path, content_hash)``
with the checkout's manifest (one indexed query per source) and rewrites only changed files,
so it follows every ingestion, including a failed run's partial writes. Writers hold an
exclusive ``flock``, grep holds a shared one; files are replaced atomically. A file longer than
the stored content limit (400,000 characters) is grepped over its stored part.

How the question becomes patterns (:func:`grep_patterns`), all fixed strings (``-F``), each
passed with ``-e`` after the options and before ``--``, never as an option: quoted text
(``"..."`` or a backticked phrase) case-sensitive, weight 3; identifiers
(``search.retrieval.query_identifiers``: snake_case, camelCase, CamelCase, backticked) and
dotted paths (``app.include_router``) case-insensitive, weight 2; when the question names none
of these, its content words (4+ letters, not stop words) case-insensitive, weight 1.

How a row scores (:func:`score_matches`): each matching line ``path:line`` maps to the
smallest ``code_chunk`` whose line range holds it (else the file's ``code_file`` row), read
through the scope (tenant, allowed sources, principals), so grep never returns a row the asker
may not read. ``score(row) = sum over patterns p matched in the row of w_p * idf_p * (1 + ln n_p)``
with ``n_p`` the row's lines matching ``p`` (a row using a name forty times is not forty
times better than one defining it) and ``idf_p = ln(1 + F / f_p)`` over the ``F`` readable
files grepped and the ``f_p`` holding ``p`` (Spärck Jones, 1972): a word in every file counts
little. Ties: the shorter row first. At most ``PER_FILE`` rows per file.

The grep list and the hybrid code search (``hybrid_search(kinds=code_file, code_chunk)``) are
fused with reciprocal rank fusion, ``sum 1 / (60 + rank)`` (Cormack et al., SIGIR 2009).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import re
import selectors
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path, PurePosixPath

from django.conf import settings
from django.db import connection

from kbportal.tenancy import tenant_context
from search.pipeline.evidence import SNIPPET_CHARS, Evidence, evidence_from_hit
from search.retrieval import Hit, clean_query, hybrid_search, query_identifiers, rrf_fuse, scope_where_sql
from search.tools.base import register, scoped_hits
from sources.selectors import QueryScope

CODE_KINDS = ("code_file", "code_chunk")
GREP_TIMEOUT_SECONDS = 5.0
MAX_OUTPUT_BYTES = 4_000_000  # grep output read per run; the rest is dropped (the run is stopped)
MAX_COUNT_PER_FILE = 50  # matching lines per file and pattern group
MAX_PATTERNS = 12
PER_FILE = 3
GREP_CANDIDATES = 50
HYBRID_CANDIDATES = 20
QUOTED_WEIGHT, IDENTIFIER_WEIGHT, WORD_WEIGHT = 3.0, 2.0, 1.0
MAX_LINES_SHOWN = 20
_WRITE_BATCH = 200

_QUOTED = re.compile(r'"([^"\n]{3,200})"|`([^`\n]{3,200})`')
_DOTTED = re.compile(r"\b[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+\b")
_WORD = re.compile(r"[A-Za-z][A-Za-z0-9]{3,}")
_STOP = set(
    """what where which when does that this with from have into there their about should would could find
    show code file files function functions class classes method methods defined define implemented implement
    used uses using call calls called handle handles handled work works make makes module modules repository
    know need want some other each they them then than also only just like more most here after before being
    does done value values return returns""".split()
)


@dataclass(frozen=True)
class Pattern:
    """One fixed string to grep for: ``text``, case-sensitive or not, and its weight."""

    text: str
    weight: float
    case_sensitive: bool


def grep_patterns(query: str) -> list[Pattern]:
    """The question's grep patterns (module docstring), longest first within each case group,
    each text once, at most ``MAX_PATTERNS``. Empty when the question names nothing to grep."""
    patterns: list[Pattern] = []
    seen: set[str] = set()

    def add(text: str, weight: float, case_sensitive: bool) -> None:
        text = text.strip()
        key = text if case_sensitive else text.lower()
        if len(text) >= 3 and key not in seen and len(patterns) < MAX_PATTERNS:
            seen.add(key)
            patterns.append(
                Pattern(text=text if case_sensitive else text.lower(), weight=weight, case_sensitive=case_sensitive)
            )

    for match in _QUOTED.finditer(query):
        text = match.group(1) or match.group(2)
        if match.group(2) and re.fullmatch(r"[\w.]+\(?\)?", text):
            continue  # a backticked name is an identifier, below
        add(text, QUOTED_WEIGHT, True)
    for dotted in _DOTTED.findall(query):
        if not re.fullmatch(r"(?i)(e\.g|i\.e|etc)", dotted):
            add(dotted, IDENTIFIER_WEIGHT, False)
    for name in query_identifiers(query):
        add(name, IDENTIFIER_WEIGHT, False)
    if not patterns:
        words = [w for w in _WORD.findall(query) if w.lower() not in _STOP]
        for word in sorted(dict.fromkeys(words), key=len, reverse=True):
            add(word, WORD_WEIGHT, False)
    return sorted(patterns, key=lambda p: (p.case_sensitive, -len(p.text)))


# -- the checkout ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CodeSource:
    """A data source in scope that holds ``code_file`` rows, with its path globs."""

    id: int
    public_id: str
    include: tuple[str, ...]
    exclude: tuple[str, ...]

    def path_allowed(self, path: str) -> bool:
        """The connectors' rule: an include glob matches (or there is none) and no exclude glob."""
        if self.include and not any(fnmatch(path, g) for g in self.include):
            return False
        return not any(fnmatch(path, g) for g in self.exclude)


def code_sources(scope: QueryScope) -> list[CodeSource]:
    """The scope's data sources that have ``code_file`` rows, in id order (tenant context)."""
    if not scope.allowed_source_ids:
        return []
    with tenant_context(scope.tenant_id, user_id=scope.user_id), connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT s.id, s.public_id, s.include, s.exclude FROM sources_datasource s
            WHERE s.tenant_id = %s AND s.id = ANY(%s) AND EXISTS (
                SELECT 1 FROM sources_document d
                WHERE d.tenant_id = s.tenant_id AND d.source_id = s.id AND d.kind = 'code_file'
            )
            ORDER BY s.id
            """,
            [scope.tenant_id, list(scope.allowed_source_ids)],
        )
        rows = cursor.fetchall()

    def globs(value) -> tuple[str, ...]:
        value = json.loads(value) if isinstance(value, str) else value
        return tuple(str(g) for g in value or [])

    return [CodeSource(id=r[0], public_id=str(r[1]), include=globs(r[2]), exclude=globs(r[3])) for r in rows]


def safe_relative_path(path: str) -> PurePosixPath | None:
    """``path`` as a relative path that stays inside a directory, or ``None`` (absolute,
    ``..``, empty parts, NUL, backslashes: a row from a custom connector cannot write elsewhere)."""
    if not path or "\0" in path or "\\" in path or path.startswith("/"):
        return None
    pure = PurePosixPath(path)
    if any(part in {"", ".", ".."} for part in pure.parts) or str(pure) != path:
        return None
    return pure


def checkout_root(source: CodeSource) -> Path:
    return Path(settings.KB_WORKDIR) / "checkouts" / source.public_id


@contextlib.contextmanager
def _locked(root: Path, mode: int) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "a") as handle:
        fcntl.flock(handle, mode)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@dataclass
class CheckoutSync:
    """What a refresh did: files written and removed, files now in the checkout, seconds."""

    tree: Path
    written: int = 0
    removed: int = 0
    files: int = 0
    seconds: float = 0.0


def checkout_sync(*, scope: QueryScope, source: CodeSource) -> CheckoutSync:
    """Bring ``source``'s checkout in line with its ``code_file`` rows (module docstring).

    Reads the rows in the scope's tenant context; writes only files whose content hash changed
    and removes files no longer indexed (or no longer allowed by the globs). Paths that would
    leave the checkout are skipped. Returns what it did; raises ``OSError`` when the work
    directory cannot be written.
    """
    started = time.perf_counter()
    root = checkout_root(source)
    tree = root / "tree"
    with tenant_context(scope.tenant_id, user_id=scope.user_id), connection.cursor() as cursor:
        cursor.execute(
            "SELECT d.id, d.path, d.content_hash FROM sources_document d "
            "WHERE d.tenant_id = %s AND d.source_id = %s AND d.kind = 'code_file'",
            [scope.tenant_id, source.id],
        )
        indexed = {
            path: (doc_id, digest)
            for doc_id, path, digest in cursor.fetchall()
            if safe_relative_path(path) is not None and source.path_allowed(path)
        }
    result = CheckoutSync(tree=tree, files=len(indexed))
    manifest_path = root / "manifest.json"
    with _locked(root, fcntl.LOCK_EX):
        try:
            manifest: dict[str, str] = json.loads(manifest_path.read_text())["files"]
        except (OSError, ValueError, KeyError, TypeError):
            manifest = {}
            shutil.rmtree(tree, ignore_errors=True)  # unknown state: start again
        stale = [p for p in manifest if p not in indexed]
        changed = [p for p, (_, digest) in indexed.items() if manifest.get(p) != digest]
        if not stale and not changed:
            result.seconds = time.perf_counter() - started
            return result
        tree.mkdir(parents=True, exist_ok=True)
        for path in stale:
            with contextlib.suppress(FileNotFoundError, IsADirectoryError, NotADirectoryError):
                (tree / path).unlink()
            manifest.pop(path, None)
            result.removed += 1
        for start in range(0, len(changed), _WRITE_BATCH):
            batch = changed[start : start + _WRITE_BATCH]
            with tenant_context(scope.tenant_id, user_id=scope.user_id), connection.cursor() as cursor:
                cursor.execute(
                    "SELECT d.path, d.content FROM sources_document d WHERE d.tenant_id = %s AND d.id = ANY(%s)",
                    [scope.tenant_id, [indexed[p][0] for p in batch]],
                )
                contents = dict(cursor.fetchall())
            for path in batch:
                if path in contents and _write_file(tree, root, path, contents[path]):
                    manifest[path] = indexed[path][1]
                    result.written += 1
        tmp = root / f"manifest.json.{os.getpid()}"
        tmp.write_text(json.dumps({"files": manifest}))
        os.replace(tmp, manifest_path)
    result.seconds = time.perf_counter() - started
    return result


def _write_file(tree: Path, root: Path, path: str, content: str) -> bool:
    """Write one file atomically under ``tree``; False when its place is taken (a file where
    a directory must go, or the reverse)."""
    target = tree / path
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        return False
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=root, delete=False, newline="") as handle:
        handle.write(content)
    try:
        os.replace(handle.name, target)
        return True
    except (IsADirectoryError, NotADirectoryError, FileExistsError):
        os.unlink(handle.name)
        return False


# -- grep ------------------------------------------------------------------------------------------


def grep_program() -> tuple[str, str]:
    """``("rg", path)`` for the ripgrep next to the running Python (the ``ripgrep`` wheel) or on
    ``PATH``, else ``("git", path)`` for ``git grep --no-index``. Raises ``FileNotFoundError``
    when neither exists."""
    beside = Path(sys.executable).parent / "rg"
    if beside.is_file() and os.access(beside, os.X_OK):
        return "rg", str(beside)
    for name in ("rg", "git"):
        found = shutil.which(name)
        if found:
            return name, found
    raise FileNotFoundError("neither ripgrep (rg) nor git is installed")


def grep_command(program: tuple[str, str], patterns: Sequence[Pattern], *, case_sensitive: bool) -> list[str]:
    """The argument list (no shell) that greps the current directory for ``patterns``, printing
    each match as ``path NUL line : match`` (rg) or ``path NUL line NUL match`` (git)."""
    kind, path = program
    if kind == "rg":
        cmd = [
            path,
            "--no-config",
            "--fixed-strings",
            "--only-matching",
            "--line-number",
            "--with-filename",
            "--null",
            "--no-heading",
            "--color",
            "never",
            "--hidden",
            "--no-ignore",
            "--no-messages",
            "--max-count",
            str(MAX_COUNT_PER_FILE),
        ]
    else:
        cmd = [
            path,
            "-c",
            "core.quotepath=off",
            "grep",
            "--no-index",
            "--no-color",
            "-I",
            "--fixed-strings",
            "--only-matching",
            "--line-number",
            "--null",
            "--max-count",
            str(MAX_COUNT_PER_FILE),
        ]
    if not case_sensitive:
        cmd.append("--ignore-case")
    for pattern in patterns:
        cmd += ["-e", pattern.text]
    return cmd + ["--", "."]


@dataclass
class GrepRun:
    """Matches of one grep run: ``(path, line) -> matched texts``; ``truncated`` when output
    or time ran out."""

    matches: dict[tuple[str, int], list[str]] = field(default_factory=dict)
    truncated: bool = False
    seconds: float = 0.0


def run_grep(cmd: list[str], *, cwd: Path, git_format: bool, timeout: float = GREP_TIMEOUT_SECONDS) -> GrepRun:
    """Run ``cmd`` in ``cwd`` (no shell, stdin closed) and parse its matches (``git_format``:
    ``git grep``'s NUL after the line number). Reads at most ``MAX_OUTPUT_BYTES`` and waits at
    most ``timeout`` seconds, then stops the process."""
    started = time.perf_counter()
    run = GrepRun()
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "LC_ALL": "C", "GIT_OPTIONAL_LOCKS": "0"},
    )
    assert proc.stdout is not None
    chunks: list[bytes] = []
    size = 0
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        deadline = started + timeout
        while True:
            remaining = deadline - time.perf_counter()
            if remaining <= 0 or not selector.select(timeout=remaining):
                run.truncated = True
                break
            piece = os.read(proc.stdout.fileno(), 65536)
            if not piece:
                break
            chunks.append(piece)
            size += len(piece)
            if size >= MAX_OUTPUT_BYTES:
                run.truncated = True
                break
    if run.truncated:
        proc.kill()
    proc.stdout.close()
    proc.wait()
    data = b"".join(chunks)
    lines = data.split(b"\n")
    if run.truncated:
        lines = lines[:-1]  # the last line may be cut
    for raw in lines:
        path_bytes, sep, rest = raw.partition(b"\0")
        if not sep:
            continue
        line_bytes, sep, text = rest.partition(b"\0" if git_format else b":")
        if not sep or not line_bytes.isdigit():
            continue
        path = path_bytes.decode("utf-8", "replace").removeprefix("./")
        run.matches.setdefault((path, int(line_bytes)), []).append(text.decode("utf-8", "replace"))
    run.seconds = time.perf_counter() - started
    return run


# -- mapping and scoring ---------------------------------------------------------------------------


@dataclass
class RowMatch:
    """A readable code row and what grep found in it: matching lines per pattern."""

    document_id: int
    path: str
    start_line: int | None
    end_line: int | None
    lines: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set))
    score: float = 0.0

    @property
    def size(self) -> int:
        return (self.end_line or 0) - (self.start_line or 0)


def _pattern_of(text: str, patterns: Sequence[Pattern]) -> Pattern | None:
    for pattern in patterns:
        if (text if pattern.case_sensitive else text.lower()) == pattern.text:
            return pattern
    return None


def map_matches(
    matches: dict[tuple[str, int], list[str]], patterns: Sequence[Pattern], *, scope: QueryScope, source_id: int
) -> dict[int, RowMatch]:
    """Map ``(path, line)`` matches of one source onto the rows ``scope`` may read: the smallest
    ``code_chunk`` holding the line, else the ``code_file`` row. One scoped query."""
    paths = sorted({path for path, _ in matches})
    if not paths:
        return {}
    where, params = scope_where_sql(scope, CODE_KINDS)
    params.update(source_id=source_id, paths=paths)
    with tenant_context(scope.tenant_id, user_id=scope.user_id), connection.cursor() as cursor:
        cursor.execute(
            f"SELECT d.id, d.kind, d.path, d.start_line, d.end_line FROM sources_document d "
            f"WHERE {where} AND d.source_id = %(source_id)s AND d.path = ANY(%(paths)s)",
            params,
        )
        rows = cursor.fetchall()
    chunks: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    files: dict[str, int] = {}
    for doc_id, kind, path, start, end in rows:
        if kind == "code_file":
            files[path] = doc_id
        elif start is not None and end is not None:
            chunks[path].append((end - start, start, doc_id))
    for spans in chunks.values():
        spans.sort()
    found: dict[int, RowMatch] = {}
    bounds = {doc_id: (path, start, end) for doc_id, _, path, start, end in rows}
    for (path, line), texts in matches.items():
        doc_id = next((d for _, start, d in chunks.get(path, []) if start <= line <= bounds[d][2]), files.get(path))
        if doc_id is None:
            continue  # not readable, or not indexed any more
        row = found.get(doc_id)
        if row is None:
            _, start, end = bounds[doc_id]
            row = found[doc_id] = RowMatch(document_id=doc_id, path=path, start_line=start, end_line=end)
        for text in texts:
            pattern = _pattern_of(text, patterns)
            if pattern is not None:
                row.lines[pattern.text].add(line)
    return {doc_id: row for doc_id, row in found.items() if row.lines}


def score_matches(rows: list[RowMatch], patterns: Sequence[Pattern], *, files_searched: int) -> list[RowMatch]:
    """Score and rank rows (module docstring): ``sum_p w_p * ln(1 + F / f_p) * (1 + ln n_p)``;
    best first, ties to the shorter row, then path and line; at most ``PER_FILE`` per file."""
    by_text = {p.text: p for p in patterns}
    files_with: dict[str, set[str]] = defaultdict(set)
    for row in rows:
        for text in row.lines:
            files_with[text].add(row.path)
    total = max(files_searched, len({row.path for row in rows}), 1)
    for row in rows:
        row.score = sum(
            by_text[text].weight * math.log(1 + total / len(files_with[text])) * (1 + math.log(len(lines)))
            for text, lines in row.lines.items()
        )
    rows.sort(key=lambda r: (-r.score, r.size, r.path, r.start_line or 0))
    kept: list[RowMatch] = []
    per_file: dict[str, int] = defaultdict(int)
    for row in rows:
        if per_file[row.path] < PER_FILE:
            per_file[row.path] += 1
            kept.append(row)
    return kept


@dataclass
class GrepResult:
    """Ranked grep rows of the scope and how the search went: ``files_searched`` is the number of
    readable files (0 when nothing matched), timings in milliseconds."""

    rows: list[RowMatch]
    patterns: list[Pattern]
    program: str = ""
    files_searched: int = 0
    truncated: bool = False
    timings_ms: dict[str, float] = field(default_factory=dict)


def grep_code(query: str, scope: QueryScope) -> GrepResult:
    """Grep the scope's code checkouts for the question's patterns and rank the readable rows.

    Returns an empty result when the question yields no pattern or the scope has no code.
    Raises ``InvalidQuery`` for a blank or too long question and ``FileNotFoundError`` when no grep exists.
    """
    query = clean_query(query)
    patterns = grep_patterns(query)
    result = GrepResult(rows=[], patterns=patterns)
    sources = code_sources(scope) if patterns else []
    if not sources:
        return result
    program = grep_program()
    result.program = program[0]
    rows: list[RowMatch] = []
    for source in sources:
        t0 = time.perf_counter()
        sync = checkout_sync(scope=scope, source=source)
        result.timings_ms["checkout"] = result.timings_ms.get("checkout", 0.0) + (time.perf_counter() - t0) * 1000
        matches: dict[tuple[str, int], list[str]] = defaultdict(list)
        t0 = time.perf_counter()
        with _locked(checkout_root(source), fcntl.LOCK_SH):
            for case_sensitive in (True, False):
                group = [p for p in patterns if p.case_sensitive == case_sensitive]
                if group and sync.tree.is_dir():
                    run = run_grep(
                        grep_command(program, group, case_sensitive=case_sensitive),
                        cwd=sync.tree,
                        git_format=program[0] == "git",
                    )
                    result.truncated |= run.truncated
                    for key, texts in run.matches.items():
                        if source.path_allowed(key[0]):
                            matches[key].extend(texts)
        result.timings_ms["grep"] = result.timings_ms.get("grep", 0.0) + (time.perf_counter() - t0) * 1000
        t0 = time.perf_counter()
        rows.extend(map_matches(matches, patterns, scope=scope, source_id=source.id).values())
        result.timings_ms["map"] = result.timings_ms.get("map", 0.0) + (time.perf_counter() - t0) * 1000
    if rows:
        result.files_searched = _readable_files(scope)
    result.rows = score_matches(rows, patterns, files_searched=result.files_searched)
    return result


def _readable_files(scope: QueryScope) -> int:
    """How many ``code_file`` rows the scope may read (the ``F`` of the IDF)."""
    where, params = scope_where_sql(scope, ("code_file",))
    with tenant_context(scope.tenant_id, user_id=scope.user_id), connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM sources_document d WHERE {where}", params)
        return int(cursor.fetchone()[0])


def _excerpt(hit: Hit, lines: list[int]) -> str:
    """The chunk's text, or when the matched lines lie past ``SNIPPET_CHARS`` a few lines
    around each (at most five places), so the block shows what matched."""
    body = hit.content
    if not lines or hit.start_line is None:
        return body[:SNIPPET_CHARS]
    code = body.split("\n")
    first = lines[0] - hit.start_line
    if len("\n".join(code[: first + 3])) <= SNIPPET_CHARS:
        return body[:SNIPPET_CHARS]
    pieces, last = [], -1
    for line in lines[:5]:
        lo, hi = max(line - hit.start_line - 2, last + 1), min(line - hit.start_line + 3, len(code))
        if lo < hi:
            pieces.append(("...\n" if lo > last + 1 else "") + "\n".join(code[lo:hi]))
            last = hi - 1
    return "\n".join(pieces)[:SNIPPET_CHARS]


@register(
    "search_code",
    "Search code: exact identifiers, strings and words grepped in the indexed repositories (ripgrep), "
    "fused with hybrid search over code files and chunks.",
)
def search_code(*, query: str, scope: QueryScope, limit: int = 10) -> list[Evidence]:
    """Code evidence for ``query``: the grep ranking (module docstring) and the hybrid code
    search's ranking fused with RRF; at most ``limit`` rows, best first, ``score`` the fused
    score. Rows grep found carry ``metadata["grep"] = {"lines": [...], "patterns": [...]}``
    (at most ``MAX_LINES_SHOWN`` line numbers) and, when the hybrid search did not rank them
    lexically, their grep rank as ``lexical_rank`` (a literal match of the question's terms).
    Only rows ``scope`` may read. Raises ``InvalidQuery`` for a blank or too long question.
    """
    grep = grep_code(query, scope)
    # Parts of a long function stay apart here: grep maps each matched line to its part.
    hybrid = hybrid_search(query, scope, limit=HYBRID_CANDIDATES, kinds=CODE_KINDS, fold_parts=False).hits
    grep_rows = grep.rows[:GREP_CANDIDATES]
    scores, ranks = rrf_fuse({"grep": [r.document_id for r in grep_rows], "hybrid": [h.document_id for h in hybrid]})
    best = sorted(scores, key=lambda d: (-scores[d], d))[:limit]
    hits = {h.document_id: h for h in hybrid}
    missing = [d for d in best if d not in hits]
    if missing:
        loaded = scoped_hits(scope, kinds=CODE_KINDS, where="d.id = ANY(%(ids)s)", params={"ids": missing})
        hits.update({h.document_id: h for h in loaded})
    grep_by_id = {r.document_id: r for r in grep_rows}
    evidence = []
    for doc_id in best:
        hit = hits.get(doc_id)
        if hit is None:
            continue
        ev = evidence_from_hit(hit, tool="search_code")
        ev.score = scores[doc_id]
        match = grep_by_id.get(doc_id)
        if match is not None:
            lines = sorted({n for found in match.lines.values() for n in found})
            ev.metadata = {**ev.metadata, "grep": {"lines": lines[:MAX_LINES_SHOWN], "patterns": sorted(match.lines)}}
            ev.text = _excerpt(hit, lines)
            if ev.lexical_rank is None:
                ev.lexical_rank = ranks[doc_id]["grep"]
        evidence.append(ev)
    return evidence
