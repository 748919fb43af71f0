"""The git connector: a repository at one revision -> file, code chunk and commit rows.

Rows, in order: for each indexed file a ``code_file`` row (external id = the path) followed by
its ``code_chunk`` rows (``path#symbol``), then one ``commit`` row per commit, newest first
(``commit:<sha>``). Everything in a row is derived from the repository's content at the
revision (no wall-clock time, no clone location), so an unchanged file or commit produces a
row with the same content hash on the next run: no content write, no embedding.

Git is driven through its CLI with a fixed number of processes per run, whatever the number of
files: ``ls-tree`` lists the files, one ``cat-file --batch`` reads them all, one ``log`` yields
the commits and the last commit touching each file. Content is read from the object database
at the resolved commit, never from the work tree, so uncommitted edits are not indexed.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO, ClassVar
from urllib.parse import quote

from django.conf import settings

from sources.connectors.base import Connector, ConnectorError, DocumentRow, IngestReport
from sources.connectors.git.chunker import Chunk, FileOutline, chunk_file, language_for
from sources.connectors.git.config import GitConfig

logger = logging.getLogger(__name__)

EMBED_TEXT_CHARS = 1500  # the embedded text of a row; MiniLM reads ~256 tokens of it anyway
DOCSTRING_CHARS = 500  # of a docstring repeated in the embedded text
MAX_LISTED_FILES = 200  # files named in a commit's content (metadata keeps up to 1000)
FILE_DATE_SCAN_LIMIT = 20_000  # commits walked to date files; older-only files get no date
CLONE_TIMEOUT_SECONDS = 1800
MAX_EXTERNAL_ID_CHARS = 512  # Document.external_id's column width
PR_SUBJECT_RE = re.compile(r"\(#(\d+)\)")
PR_MERGE_RE = re.compile(r"^Merge pull request #(\d+)")
# Record layout of `git log -z --name-only`: \x1e starts a commit, \x1f separates its fields,
# \x1d ends them; NUL-separated file names follow.
LOG_FORMAT = "%x1e%H%x1f%P%x1f%an%x1f%ae%x1f%aI%x1f%cI%x1f%s%x1f%b%x1d"
# What a file's rows are made by: this module and the chunker. A stored file row made by other
# code is read again, so an upgrade that changes the rows reaches every file.
ROW_FORMAT = hashlib.sha256(
    Path(__file__).read_bytes() + (Path(__file__).parent / "chunker.py").read_bytes()
).hexdigest()[:16]


@dataclass(frozen=True)
class _Entry:
    """A file of the tree to index: path, blob id, size in bytes and language."""

    path: str
    blob: str
    size: int
    language: str


@dataclass(frozen=True)
class _Commit:
    sha: str
    parents: list[str]
    author_name: str
    author_email: str
    authored_at: datetime
    committed_at: datetime
    subject: str
    body: str
    files: list[str]


def _git_env() -> dict[str, str]:
    env = dict(os.environ)
    env["GIT_TERMINAL_PROMPT"] = "0"  # a private repository fails instead of waiting for a password
    env["GIT_OPTIONAL_LOCKS"] = "0"  # never take the index lock of someone's work tree
    env["LC_ALL"] = "C"  # git's error messages in English, for the run's error text
    env.setdefault("GIT_SSH_COMMAND", "ssh -o BatchMode=yes")
    return env


def fit_external_id(external_id: str) -> str:
    """``external_id`` itself, or when longer than the column a stable cut + hash of the whole.

    Used for a file's id and for its chunks' parent reference alike, so they still match.
    """
    if len(external_id) <= MAX_EXTERNAL_ID_CHARS:
        return external_id
    digest = hashlib.sha256(external_id.encode("utf-8")).hexdigest()[:16]
    return f"{external_id[: MAX_EXTERNAL_ID_CHARS - 17]}~{digest}"


def _redact(text: str) -> str:
    """``https://user:token@host`` -> ``https://***@host``: credentials never reach a run's error."""
    # Up to the last "@" before the host: a password may itself contain "@".
    return re.sub(r"(?<=://)[^/\s]*@", "***@", text)


def _git_command(repo: Path | None, *args: str) -> list[str]:
    base = ["git", "-c", "core.quotepath=off", "-c", "log.showSignature=false", "-c", "i18n.logOutputEncoding=UTF-8"]
    return base + (["-C", str(repo)] if repo is not None else []) + list(args)


def _run_git(repo: Path | None, *args: str, timeout: float | None = None) -> bytes:
    """stdout of ``git <args>`` in ``repo``. Raises ConnectorError with git's message on failure."""
    try:
        proc = subprocess.run(
            _git_command(repo, *args), capture_output=True, env=_git_env(), timeout=timeout, check=False
        )
    except FileNotFoundError as exc:
        raise ConnectorError("the git command-line tool is not installed on the server") from exc
    except subprocess.TimeoutExpired as exc:
        raise ConnectorError(f"git {args[0]} timed out after {timeout:.0f} s") from exc
    if proc.returncode != 0:
        message = _redact(proc.stderr.decode("utf-8", "replace").strip())
        where = f" in {repo}" if repo is not None else ""
        raise ConnectorError(f"git {args[0]} failed{where}: {message or f'exit status {proc.returncode}'}")
    return proc.stdout


class _GitStream:
    """A running git process: ``stdin``/``stdout`` pipes, and ``stop()`` to end it early."""

    def __init__(self, proc: subprocess.Popen[bytes]):
        self.proc = proc
        self.stopped = False
        assert proc.stdout is not None
        self.stdout: IO[bytes] = proc.stdout
        self.stdin: IO[bytes] | None = proc.stdin

    def stop(self) -> None:
        """Mark that the caller has read all it needs; the exit status is then not checked."""
        self.stopped = True


@contextlib.contextmanager
def _git_stream(repo: Path, *args: str, stdin: bool = False) -> Iterator[_GitStream]:
    """A running ``git <args>`` whose stdout (and stdin) the caller reads (writes) incrementally.

    On exit the pipes are closed and the process reaped. When the caller read to the end
    without calling ``stop()``, a non-zero exit raises ConnectorError with git's message.
    stderr goes to a file so a chatty git cannot block on a full pipe.
    """
    with tempfile.TemporaryFile() as errors:
        proc = subprocess.Popen(
            _git_command(repo, *args),
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=errors,
            env=_git_env(),
        )
        stream = _GitStream(proc)
        try:
            yield stream
        finally:
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()
            try:
                proc.wait(timeout=30)  # with its stdout closed, git ends on its next write
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.returncode != 0 and not stream.stopped:
            errors.seek(0)
            message = _redact(errors.read().decode("utf-8", "replace").strip())
            raise ConnectorError(f"git {args[0]} failed in {repo}: {message or f'exit status {proc.returncode}'}")


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock: two runs never clone or fetch into one directory at once."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def clone_directory_name(url: str) -> str:
    """A directory name for a clone of ``url``: readable host/path plus a hash of the whole URL.

    The hash covers credentials too, so a source configured without them never reuses a clone
    made with them. Shape: ``github.com-org-repo-1a2b3c4d5e6f``.
    """
    readable = re.sub(r"^[a-z][a-z0-9+.-]*://", "", url.strip(), flags=re.IGNORECASE)
    readable = re.sub(r"^[^/]*@", "", readable)  # user[:token]@ never appears in a file name
    readable = re.sub(r"[^A-Za-z0-9._-]+", "-", readable).strip("-.")
    # The end of a URL names the repository; keep it when the whole is too long.
    readable = readable.removesuffix(".git")[-60:].strip("-.") or "repo"
    return f"{readable}-{hashlib.sha256(url.encode()).hexdigest()[:12]}"


class GitConnector(Connector):
    """A git repository (local, or cloned from a URL) as files, code chunks and commits.

    Raises ConnectorError when the path is missing, is not a git repository, the revision does
    not exist or cloning/fetching fails. Skips, with a reason on the run, files over
    ``max_file_bytes``, binary files (a NUL byte) and files that are not UTF-8. Files of no
    known text language (images, archives...), symlinks and submodules are ignored silently.
    """

    kind: ClassVar[str] = "git"
    config_model: ClassVar[type[GitConfig]] = GitConfig
    config: GitConfig
    # external id of each stored code_file row -> (blob sha, url, row format), from bind_source
    stored: dict[str, tuple[str, str, str]] = {}

    def bind_source(self, *, tenant_id: int, source_id: int) -> None:
        """Note the blob, link and row format of each file the source stored, so an incremental
        run keeps unchanged files unread (``IngestReport.keep``)."""
        if not self.config.incremental:
            return
        from kbportal.tenancy import tenant_context
        from sources.models import Document

        with tenant_context(tenant_id):
            found = Document.objects.filter(source_id=source_id, kind="code_file").values_list(
                "external_id", "metadata__blob_sha", "url", "metadata__row_format"
            )
            self.stored = {eid: (str(blob or ""), url, str(fmt or "")) for eid, blob, url, fmt in found}

    # -- the repository ----------------------------------------------------------------------------

    def repository(self) -> Path:
        """The local repository to read: the configured directory, or an up-to-date clone."""
        if self.config.is_url:
            return self._clone_or_fetch(self.config.path.strip())
        path = Path(self.config.path).expanduser()
        if not path.exists():
            raise ConnectorError(f"git source path {self.config.path} does not exist")
        if not path.is_dir():
            raise ConnectorError(f"git source path {self.config.path} is not a directory")
        is_bare = (path / "HEAD").is_file() and (path / "objects").is_dir() and (path / "refs").is_dir()
        if not (path / ".git").exists() and not is_bare:
            raise ConnectorError(f"{self.config.path} is not a git repository (no .git)")
        return path

    def _clone_or_fetch(self, url: str) -> Path:
        root = Path(settings.KB_WORKDIR) / "git"
        root.mkdir(parents=True, exist_ok=True)
        dest = root / clone_directory_name(url)
        with _file_lock(root / f"{dest.name}.lock"):
            if (dest / "HEAD").is_file():
                # A bare clone has no remote-tracking refs: fetch branches and tags onto themselves.
                _run_git(
                    dest,
                    "fetch",
                    "--prune",
                    "--quiet",
                    "origin",
                    "+refs/heads/*:refs/heads/*",
                    "+refs/tags/*:refs/tags/*",
                    timeout=CLONE_TIMEOUT_SECONDS,
                )
            else:
                # Clone beside the destination and rename, so an interrupted clone never looks done.
                partial = root / f"{dest.name}.partial-{os.getpid()}"
                shutil.rmtree(partial, ignore_errors=True)
                try:
                    _run_git(None, "clone", "--bare", "--quiet", "--", url, str(partial), timeout=CLONE_TIMEOUT_SECONDS)
                except ConnectorError as exc:
                    raise ConnectorError(f"cannot clone {_redact(url)}: {exc}") from exc
                finally:
                    if not (partial / "HEAD").is_file():
                        shutil.rmtree(partial, ignore_errors=True)
                partial.rename(dest)
        return dest

    def resolve(self, repo: Path) -> str:
        """The commit sha of the configured revision. Raises ConnectorError when it does not exist."""
        revision = self.config.revision
        try:
            out = _run_git(repo, "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}")
        except ConnectorError as exc:
            if "exit status" not in str(exc):  # git said why (dubious ownership, corrupt repository)
                raise
            if revision == "HEAD":
                raise ConnectorError(f"git repository {self.config.path} has no commits yet") from exc
            raise ConnectorError(f"revision {revision!r} not found in git repository {self.config.path}") from exc
        return out.decode().strip()

    # -- files -------------------------------------------------------------------------------------

    def list_files(self, repo: Path, commit: str, report: IngestReport) -> list[_Entry]:
        """Indexable files of the commit's tree, sorted by path; oversize files are reported."""
        entries = []
        for record in _run_git(repo, "ls-tree", "-r", "-l", "-z", "--full-tree", commit).split(b"\0"):
            if not record:
                continue
            meta, _, raw_path = record.partition(b"\t")
            mode, object_type, blob, size = meta.decode().split()
            if object_type != "blob" or mode == "120000":
                continue  # submodules and symlinks carry no content of this repository
            try:
                path = raw_path.decode("utf-8")
            except UnicodeDecodeError:
                shown = raw_path.decode("utf-8", "replace")
                if language_for(shown) is not None:
                    report.skip(shown, "file name is not valid UTF-8")
                continue
            language = language_for(path)
            if language is None or not self.path_allowed(path):
                continue
            if int(size) > self.config.max_file_bytes:
                report.skip(path, f"file is {int(size)} bytes, over max_file_bytes ({self.config.max_file_bytes})")
                continue
            entries.append(_Entry(path=path, blob=blob, size=int(size), language=language))
        return sorted(entries, key=lambda e: e.path)

    @staticmethod
    def read_blobs(repo: Path, entries: list[_Entry]) -> Iterator[tuple[_Entry, bytes]]:
        """Each entry with its content, through one ``git cat-file --batch`` process.

        Request and answer alternate (git flushes after each object), so only one file is in
        memory at a time. Raises ConnectorError when an object is missing.
        """
        with _git_stream(repo, "cat-file", "--batch", stdin=True) as stream:
            assert stream.stdin is not None
            for entry in entries:
                stream.stdin.write(f"{entry.blob}\n".encode())
                stream.stdin.flush()
                header = stream.stdout.readline().decode().split()
                if len(header) != 3:
                    raise ConnectorError(f"git cat-file cannot read {entry.path} ({entry.blob}): {' '.join(header)}")
                data = stream.stdout.read(int(header[2]))
                stream.stdout.read(1)  # the newline after each object
                yield entry, data

    def file_rows(self, entry: _Entry, text: str, updated_at: datetime | None) -> Iterator[DocumentRow]:
        """The ``code_file`` row of one file, then its ``code_chunk`` rows in source order."""
        try:
            outline = chunk_file(entry.path, text)
        except Exception:  # a chunker bug must not cost the file: fall back to line windows
            logger.exception("chunking %s failed; falling back to line windows", entry.path)
            outline = chunk_file(entry.path, text, structured=False)
        line_count = len(text.splitlines())
        yield DocumentRow(
            external_id=fit_external_id(entry.path),
            kind="code_file",
            title=entry.path,
            content=text,
            text=self._file_summary(entry.path, text, outline),
            url=self._link(entry.path),
            path=entry.path,
            start_line=1 if line_count else None,
            end_line=line_count or None,
            metadata={
                "language": outline.language,
                "blob_sha": entry.blob,
                "row_format": ROW_FORMAT,
                "size_bytes": entry.size,
                "lines": line_count,
                "symbols": [symbol for _, symbol in outline.top_level][:200],
            },
            updated_at=updated_at,
        )
        for position, chunk in enumerate(outline.chunks):
            yield self._chunk_row(entry.path, outline.language, chunk, position)

    def _chunk_row(self, path: str, language: str, chunk: Chunk, position: int) -> DocumentRow:
        if chunk.symbol is None:
            title = f"{path}: lines {chunk.start_line}-{chunk.end_line}"
        elif chunk.part is not None:
            title = f"{path}: {chunk.symbol} (part {chunk.part})"
        else:
            title = f"{path}: {chunk.symbol}"
        metadata: dict[str, object] = {
            "language": language,
            "symbol": chunk.symbol,
            "symbol_kind": chunk.symbol_kind,
            "signature": chunk.signature,
        }
        if chunk.enclosing_signature:
            metadata["enclosing_signature"] = chunk.enclosing_signature
        if chunk.members:
            metadata["members"] = list(chunk.members)
        if chunk.part is not None:
            metadata["part"] = chunk.part
        # Title, context and docstring first: if the code is long, the cut falls on the code.
        head = [title, chunk.enclosing_signature, chunk.signature, chunk.docstring[:DOCSTRING_CHARS]]
        if chunk.members:
            head.append("members: " + ", ".join(chunk.members))
        text = "\n".join([part for part in head if part] + [chunk.code])[:EMBED_TEXT_CHARS]
        return DocumentRow(
            external_id=fit_external_id(f"{path}#{chunk.key}"),
            kind="code_chunk",
            title=title,
            content=chunk.code,
            text=text,
            url=self._link(path, chunk.start_line, chunk.end_line),
            path=path,
            start_line=chunk.start_line,
            end_line=chunk.end_line,
            position=position,
            parent_external_id=fit_external_id(path),
            metadata=metadata,
        )

    @staticmethod
    def _file_summary(path: str, text: str, outline: FileOutline) -> str:
        """What a file row embeds: path, docstring (or first lines), top-level symbols by kind.

        It changes only when the file's purpose or shape does, not with every edit of a body.
        """
        parts = [path]
        if outline.docstring:
            parts.append(outline.docstring[:DOCSTRING_CHARS])
        else:
            first = [line.rstrip() for line in text.split("\n") if line.strip()][:8]
            parts.append("\n".join(first)[:DOCSTRING_CHARS])
        by_kind: dict[str, list[str]] = {}
        for kind, symbol in outline.top_level:
            by_kind.setdefault(kind, []).append(symbol)
        labels = {"class": "classes", "function": "functions", "method": "methods", "type": "types"}
        for kind, symbols in by_kind.items():
            parts.append(f"{labels.get(kind, kind)}: {', '.join(symbols)}")
        return "\n".join(part for part in parts if part)[:EMBED_TEXT_CHARS]

    def _link(self, path: str, start: int | None = None, end: int | None = None) -> str:
        base = f"{self.config.url_base}/{quote(path, safe='/')}" if self.config.url_base else path
        return f"{base}#L{start}-L{end}" if start is not None else base

    # -- commits -----------------------------------------------------------------------------------

    def history(self, repo: Path, commit: str, paths: set[str]) -> tuple[list[_Commit], dict[str, datetime]]:
        """The newest ``max_commits`` commits reachable from ``commit``, and per path the date
        of the last commit that touched it, from one ``git log`` walk.

        The walk stops once both are known, or after ``FILE_DATE_SCAN_LIMIT`` commits (paths
        untouched since then get no date). Merges list the files they changed against their
        first parent, so "Merge pull request #12" carries the pull request's files.
        """
        limit = self.config.max_commits
        commits: list[_Commit] = []
        dates: dict[str, datetime] = {}
        remaining = set(paths)
        args = [
            "log",
            "-z",
            "--name-only",
            "--no-renames",
            "--diff-merges=first-parent",
            "--no-ext-diff",
            "--no-textconv",
            f"--format={LOG_FORMAT}",
        ]
        with _git_stream(repo, *args, commit, "--") as stream:
            for scanned, record in enumerate(_log_records(stream.stdout), start=1):
                parsed = _parse_commit(record)
                if len(commits) < limit:
                    commits.append(parsed)
                for path in parsed.files:
                    if path in remaining:
                        dates[path] = parsed.committed_at
                        remaining.discard(path)
                if len(commits) >= limit and (not remaining or scanned >= FILE_DATE_SCAN_LIMIT):
                    stream.stop()
                    break
        return commits, dates

    def commit_row(self, commit: _Commit) -> DocumentRow:
        """The ``commit`` row: subject, body and changed files; pull request number when named."""
        listed = commit.files[:MAX_LISTED_FILES]
        content = commit.subject
        if commit.body:
            content += "\n\n" + commit.body
        if listed:
            content += "\n\nFiles changed:\n" + "\n".join(listed)
            if len(commit.files) > len(listed):
                content += f"\n... and {len(commit.files) - len(listed)} more"
        url = f"{self.config.url_base}/commit/{commit.sha}" if self.config.url_base else f"commit/{commit.sha}"
        if commit.author_email:  # the repository's people, for the organization's identity list
            self.directory.person(
                f"email:{commit.author_email.lower()}", email=commit.author_email, name=commit.author_name
            )
        return DocumentRow(
            external_id=f"commit:{commit.sha}",
            kind="commit",
            title=commit.subject or f"commit {commit.sha[:12]}",
            content=content,
            text=content[:EMBED_TEXT_CHARS],
            url=url,
            metadata={
                "sha": commit.sha,
                "parents": commit.parents,
                "author_name": commit.author_name,
                "author_email": commit.author_email,
                "date": commit.authored_at.isoformat(),
                "committed_date": commit.committed_at.isoformat(),
                "files": commit.files[:1000],
                "files_count": len(commit.files),
                "pr_number": pr_number(commit.subject),
            },
            created_at=commit.authored_at,
            updated_at=commit.committed_at,
        )

    # -- the run -----------------------------------------------------------------------------------

    def iter_rows(self, report: IngestReport) -> Iterator[DocumentRow]:
        """Files with their chunks (sorted by path), then commits newest first. A file whose
        stored row has its blob, link and row format (``bind_source``) is kept, not read.

        Sets ``report.total`` to the number of files and advances ``report`` by one after each
        file (kept and skipped ones included); the commits, a row each and cheap beside a file's
        chunks, come after and count in no unit. Raises ConnectorError before the first row
        when the repository or revision cannot be read.
        """
        repo = self.repository()
        commit = self.resolve(repo)
        entries = self.list_files(repo, commit, report)
        changed = []
        for entry in entries:
            external_id = fit_external_id(entry.path)
            if self.stored.get(external_id) == (entry.blob, self._link(entry.path), ROW_FORMAT):
                report.keep(external_id)  # the same blob makes the same rows: kept unread
                report.advance()
            else:
                changed.append(entry)
        commits, dates = self.history(repo, commit, {e.path for e in changed})
        report.total, report.unit = len(entries), "files"
        for entry, data in self.read_blobs(repo, changed):
            text = _decode(entry.path, data, report)
            if text is not None:
                yield from self.file_rows(entry, text, dates.get(entry.path))
            report.advance()
        for parsed in commits:
            yield self.commit_row(parsed)


def pr_number(subject: str) -> int | None:
    """The pull request number named in a commit subject, or None.

    ``"Fix encoders (#1234)"`` (squash merge) and ``"Merge pull request #1234 from a/b"`` (merge
    commit) -> 1234; with several ``(#n)`` the last one, which is the squash-merge suffix.
    """
    found = PR_SUBJECT_RE.findall(subject)
    if found:
        return int(found[-1])
    merge = PR_MERGE_RE.match(subject)
    return int(merge.group(1)) if merge else None


def _decode(path: str, data: bytes, report: IngestReport) -> str | None:
    """The file's text (BOM dropped, CRLF -> LF), or None after reporting why it was skipped."""
    nul = data.find(b"\0")
    if nul != -1:
        # PostgreSQL text cannot hold NUL either, so any NUL (not only in the first 8 KB) skips.
        where = "in the first 8 KB" if nul < 8192 else f"at byte {nul}"
        report.skip(path, f"binary file (NUL byte {where})")
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        report.skip(path, f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})")
        return None
    return text.removeprefix("\ufeff").replace("\r\n", "\n")


def _log_records(stream: IO[bytes]) -> Iterator[bytes]:
    """The records of a ``git log --format=%x1e...`` stream, read in 64 KB pieces."""
    buffer = b""
    while piece := stream.read(65536):
        buffer += piece
        *records, buffer = buffer.split(b"\x1e")
        yield from (r for r in records if r)
    if buffer:
        yield buffer


def _parse_commit(record: bytes) -> _Commit:
    header, _, names = record.partition(b"\x1d")
    sha, parents, name, email, authored, committed, subject, body = header.decode("utf-8", "replace").split("\x1f", 7)
    files = [f.decode("utf-8", "replace") for f in names.split(b"\0") if f.strip(b"\n")]
    return _Commit(
        sha=sha,
        parents=parents.split(),
        author_name=name,
        author_email=email,
        authored_at=datetime.fromisoformat(authored),
        committed_at=datetime.fromisoformat(committed),
        subject=subject,
        body=body.strip(),
        files=[f.lstrip("\n") for f in files],
    )
