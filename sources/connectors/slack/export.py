"""Reading a Slack export in place, from a folder or a ZIP, without extracting it to disk."""

from __future__ import annotations

import re
import zipfile
from collections import defaultdict
from pathlib import Path

from sources.connectors.base import ConnectorError
from sources.connectors.files import DEFAULT_MAX_FILE_BYTES, read_bounded, read_zip_member_bounded

DAY_FILE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}\.json$")


class SlackExport:
    """Read-only view of an export folder or ZIP: top-level JSON files and per-channel day files.

    Raises ``ConnectorError`` naming ``path`` when it is missing, not a folder or ZIP, or holds
    no ``channels.json``. A ZIP is read in place (no extraction to disk); its export may sit
    at the root or inside one top-level folder. ``max_file_bytes``: the largest file
    :meth:`read` returns.
    """

    def __init__(self, path: str, *, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES) -> None:
        self.path = path
        self.max_file_bytes = max_file_bytes
        self._zip: zipfile.ZipFile | None = None
        self._root: Path | None = None
        self._prefix = ""
        target = Path(path).expanduser()
        if not target.exists():
            raise ConnectorError(f"Slack export {path!r} does not exist")
        if target.is_dir():
            if not (target / "channels.json").is_file():
                raise ConnectorError(f"Slack export {path!r} has no channels.json (is it a Slack workspace export?)")
            self._root = target
            return
        try:
            self._zip = zipfile.ZipFile(target)
        except (zipfile.BadZipFile, OSError) as exc:
            raise ConnectorError(f"Slack export {path!r} is neither a folder nor a readable ZIP file: {exc}") from exc
        # Zipping a folder puts the export under "<folder>/"; macOS adds "__MACOSX/" shadows.
        candidates = sorted(
            (name for name in self._zip.namelist() if name.rsplit("/", 1)[-1] == "channels.json"),
            key=lambda name: (name.startswith("__MACOSX/"), name.count("/"), name),
        )
        if not candidates or candidates[0].startswith("__MACOSX/"):
            self._zip.close()
            raise ConnectorError(f"Slack export {path!r} has no channels.json (is it a Slack workspace export?)")
        self._prefix = candidates[0][: -len("channels.json")]

    def close(self) -> None:
        if self._zip is not None:
            self._zip.close()

    def read(self, name: str) -> bytes | None:
        """The bytes of ``name`` (a path relative to the export root), or ``None`` if absent.

        Raises ``sources.connectors.files.FileTooLarge`` when it holds over ``max_file_bytes``
        (nothing over the limit is read into memory), ``FileRefused`` when it is not a regular
        file (a link, a pipe) or an unreadable ZIP member.
        """
        if self._root is not None:
            file = self._root / name
            return read_bounded(file, self.max_file_bytes) if file.is_file() or file.is_symlink() else None
        assert self._zip is not None
        try:
            return read_zip_member_bounded(self._zip, self._prefix + name, self.max_file_bytes)
        except KeyError:
            return None

    def day_files(self) -> dict[str, list[str]]:
        """Channel folder name -> its day file names (``YYYY-MM-DD.json``), oldest first."""
        found: dict[str, list[str]] = defaultdict(list)
        if self._root is not None:
            for folder in self._root.iterdir():
                if folder.is_dir():
                    found[folder.name] = [f.name for f in folder.iterdir() if DAY_FILE_RE.match(f.name) and f.is_file()]
        else:
            assert self._zip is not None
            for name in self._zip.namelist():
                if not name.startswith(self._prefix):
                    continue
                parts = name[len(self._prefix) :].split("/")
                if len(parts) == 2 and parts[0] and DAY_FILE_RE.match(parts[1]):
                    found[parts[0]].append(parts[1])
        return {folder: sorted(names) for folder, names in found.items() if names}
