"""Fetching dataset archives: resumable HTTP(S) download, sha256 checks, safe extraction.

* :func:`download` streams a URL to ``<dest>.part`` (with a tqdm progress bar), resumes an
  existing ``.part`` with an HTTP ``Range`` request (and starts over when the server ignores it),
  and renames the file to ``dest`` when it is complete.
* :func:`check_sha256` compares a file with an expected sha256; a mismatching download is moved
  aside to ``<name>.bad`` and never used.
* :func:`extract` copies chosen members of a zip or tar (``.tar``, ``.tgz``, ``.tar.gz/bz2/xz``)
  archive, after refusing any member whose path or link target would leave the output folder.
"""

from __future__ import annotations

import bz2
import gzip
import http.client
import lzma
import posixpath
import re
import shutil
import stat
import sys
import tarfile
import urllib.error
import urllib.request
import zipfile
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path

from txl.errors import TxlError
from txl.fileio import oserrors_as, sha256_file
from txl.runtime import progress_bar

__all__ = ["is_url", "is_archive", "check_sha256", "download", "extract", "safe_member_name"]

CHUNK = 1 << 20  # bytes read per network / copy step
Log = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr)


def is_url(source: str) -> bool:
    """True if ``source`` is an ``http://`` or ``https://`` URL."""
    return isinstance(source, str) and re.match(r"(?i)https?://", source) is not None


def check_sha256(path: Path, expected: str | None, *, what: str, keep_aside: bool, log: Log = _stderr) -> tuple[str, bool]:
    """Compute the sha256 of ``path`` and compare it with ``expected`` (hex, any case).

    Returns ``(sha256, verified)``; ``verified`` is False when ``expected`` is None (the computed
    value is logged as not verified). On a mismatch raises :class:`TxlError`; with
    ``keep_aside`` (a download) the file is first renamed to ``<name>.bad`` so it is never used.
    ``what`` names the expected value in messages (e.g. "the known checksum of enwik8.zip").
    """
    digest = sha256_file(path)
    if expected is None:
        log(f"sha256 of {path.name}: {digest} (not verified: no known checksum; pass --sha256 to check it)")
        return digest, False
    if digest != expected.lower():
        where = ""
        if keep_aside:
            bad = path.with_name(path.name + ".bad")
            path.replace(bad)
            where = f"; the file was kept aside as {bad}"
        raise TxlError(f"sha256 mismatch for {path.name}: got {digest}, expected {expected.lower()} ({what}){where}")
    log(f"sha256 of {path.name} verified: {digest}")
    return digest, True


def download(url: str, dest: Path, *, progress: bool = True, timeout: float = 60.0, log: Log = _stderr) -> Path:
    """Download ``url`` to ``dest`` through ``<dest>.part``, resuming a ``.part`` left by an earlier try.

    With a ``.part`` of n bytes, asks for ``Range: bytes=n-``; a ``206`` answer starting at n is
    appended, a ``200`` answer (the server ignored the range) or a ``416`` restarts from byte 0.
    Every network operation has a ``timeout`` (seconds). Returns ``dest``.

    Raises :class:`TxlError` for a non-HTTP(S) URL, a network or HTTP error, or a transfer that
    ends early (the ``.part`` is kept: running again resumes it).
    """
    if not is_url(url):
        raise TxlError(f"{url!r} is not an http(s) URL")
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    for _attempt in range(3):  # a resume, then at most two restarts from byte 0
        start = part.stat().st_size if part.exists() else 0
        headers = {"User-Agent": "txl-data/1", "Accept-Encoding": "identity"}
        if start:
            headers["Range"] = f"bytes={start}-"
        try:
            resp = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout)
        except urllib.error.HTTPError as e:
            if e.code == 416 and start:
                log(f"the server cannot resume {dest.name} at byte {start}; downloading it again")
                part.unlink()
                continue
            raise TxlError(f"download of {url} failed: HTTP {e.code} {e.reason}") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", None) or e
            raise TxlError(f"download of {url} failed: {reason}; check the URL and your connection") from None
        with resp:
            total, mode = _response_plan(resp, start, dest.name, log)
            if mode is None:
                part.unlink()
                continue
            begin = start if mode == "ab" else 0
            received = _stream(resp, part, mode, begin, total, dest.name, progress, url)
            length = resp.headers.get("Content-Length")
            if length is not None and received != int(length):
                raise TxlError(
                    f"download of {url} stopped after {begin + received} bytes; run the same command again to resume"
                )
        part.replace(dest)
        return dest
    raise TxlError(f"download of {url} could not be resumed or restarted; delete {part} and try again")


def _response_plan(resp, start: int, name: str, log: Log) -> tuple[int | None, str | None]:
    """(total size or None, file mode "ab"/"wb") for a response; mode None means restart."""
    status = resp.status
    length = resp.headers.get("Content-Length")
    if status == 206 and start:
        m = re.match(r"bytes (\d+)-\d+/(\d+|\*)", resp.headers.get("Content-Range", ""))
        if m is None or int(m.group(1)) != start:
            log(f"the server answered the resume request for {name} with another range; downloading it again")
            return None, None
        log(f"resuming {name} at byte {start}")
        return (int(m.group(2)) if m.group(2) != "*" else None), "ab"
    if status == 200:
        if start:
            log(f"the server ignored the resume request for {name}; downloading it from the start")
        return (int(length) if length is not None else None), "wb"
    raise TxlError(f"download of {name} failed: unexpected HTTP status {status}")


def _stream(resp, part: Path, mode: str, begin: int, total: int | None, name: str, progress: bool, url: str) -> int:
    """Copy the response body to ``part`` (append or truncate); returns the bytes received."""
    received = 0
    try:
        with open(part, mode) as f, progress_bar(total, progress, name, unit="B", initial=begin, unit_scale=True,
                                                 unit_divisor=1024, leave=True) as bar:
            while chunk := resp.read(CHUNK):
                f.write(chunk)
                received += len(chunk)
                bar.update(len(chunk))
    except (OSError, http.client.HTTPException) as e:  # timeouts, resets, IncompleteRead
        raise TxlError(
            f"download of {url} stopped after {begin + received} bytes ({type(e).__name__}: {e}); "
            "run the same command again to resume"
        ) from None
    return received


def safe_member_name(name: str) -> str:
    """The member ``name`` as a clean relative POSIX path, or :class:`TxlError` if it would escape.

    Backslashes count as separators; ``.`` parts are dropped. Refused: absolute paths (``/x``,
    ``C:x``), any ``..`` part, and empty names.
    """
    norm = name.replace("\\", "/")
    if norm.startswith("/") or re.match(r"[A-Za-z]:", norm):
        raise TxlError(f"archive member {name!r} has an absolute path; refusing to extract this archive")
    parts = [p for p in norm.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise TxlError(f"archive member {name!r} points outside the output folder ('..'); refusing this archive")
    if not parts:
        raise TxlError(f"archive member {name!r} has an empty name; refusing this archive")
    return "/".join(parts)


def _check_link(member: str, target: str, *, hard: bool) -> None:
    """Refuse a link whose target is absolute or leaves the archive root."""
    norm = target.replace("\\", "/")
    base = "" if hard else posixpath.dirname(member)
    resolved = posixpath.normpath(posixpath.join(base, norm)) if norm else "."
    if norm.startswith("/") or re.match(r"[A-Za-z]:", norm) or resolved == ".." or resolved.startswith("../"):
        kind = "hard link" if hard else "symlink"
        raise TxlError(f"archive member {member!r} is a {kind} to {target!r} outside the output folder; refusing this archive")


def extract(archive: Path, select: Callable[[str], Sequence[Path]], *,
            max_member_bytes: int | None = None) -> dict[str, list[Path]]:
    """Check every member of a zip/tar ``archive`` and copy the selected regular files.

    ``select(name)`` gets each member's clean relative path (see :func:`safe_member_name`) and
    returns the destination paths to write it to (none to skip it). Every member is checked,
    selected or not: an absolute path, a ``..`` part, or a symlink / hard link pointing outside
    raises :class:`TxlError` naming the member, and nothing is left behind (files are written
    as ``<dest>.partial`` and renamed only after the whole archive passed). Other link, device
    or folder members are never extracted.

    Members are streamed in chunks; a selected member that grows past ``max_member_bytes`` (when
    given) stops the extraction, so a decompression bomb never fills the disk or the memory.

    Returns ``{member name: destinations}`` of the files written. Raises :class:`TxlError` for a
    file that is neither zip nor tar, a corrupt or truncated archive, a selected member that is not
    a file, or one larger than ``max_member_bytes``.
    """
    written: dict[str, list[Path]] = {}
    temps: list[tuple[Path, Path]] = []
    try:
        if _kind(archive) == "zip":
            _extract_zip(archive, select, written, temps, max_member_bytes)
        elif _kind(archive) is not None:
            _extract_tar(archive, select, written, temps, max_member_bytes)
        else:
            raise TxlError(f"{archive} is neither a zip nor a tar archive")
        for tmp, dest in temps:
            tmp.replace(dest)
    except BaseException:
        for tmp, _ in temps:
            tmp.unlink(missing_ok=True)
        raise
    return written


_MAGIC = {b"PK\x03\x04": "zip", b"PK\x05\x06": "zip", b"\x1f\x8b": "gz", b"BZh": "bz2", b"\xfd7zXZ": "xz"}


def _kind(path: Path) -> str | None:
    """``"zip"``, ``"gz"``, ``"bz2"``, ``"xz"`` (compressed, presumably tar), ``"tar"`` or None, by the
    file's first bytes (so a truncated archive is still recognised as one)."""
    try:
        with open(path, "rb") as f:
            head = f.read(512)
    except OSError:
        return None
    for magic, kind in _MAGIC.items():
        if head.startswith(magic):
            return kind
    return "tar" if len(head) == 512 and head[257:262] == b"ustar" else None


def is_archive(path: str | Path) -> bool:
    """True if ``path`` is (or starts like) a zip or a plain/gzip/bzip2/xz tar archive."""
    return Path(path).is_file() and _kind(Path(path)) is not None


def _copy_to(src, name: str, dests: Sequence[Path], written: dict, temps: list, limit: int | None) -> None:
    """Copy the open member ``src`` to the first destination, then duplicate it to the others,
    refusing to write more than ``limit`` bytes (None: no limit)."""
    first = None
    for dest in dests:
        tmp = dest.with_name(dest.name + ".partial")
        temps.append((tmp, dest))
        if first is not None:
            with oserrors_as(f"cannot write {dest}"):
                shutil.copyfile(first, tmp)
            continue
        with oserrors_as(f"cannot write {dest}"):
            dest.parent.mkdir(parents=True, exist_ok=True)
            out = open(tmp, "wb")
        size = 0
        with out:
            while chunk := src.read(CHUNK):  # reading errors propagate as archive errors
                size += len(chunk)
                if limit is not None and size > limit:
                    raise TxlError(f"archive member {name!r} is larger than {limit:,} bytes, more than the dataset "
                                   "can hold: the archive is damaged or hostile (a decompression bomb); if it is "
                                   "genuine, raise the limit (max_member_bytes)")
                with oserrors_as(f"cannot write {dest}"):
                    out.write(chunk)
        first = tmp
    written[name] = list(dests)


def _extract_zip(archive: Path, select, written: dict, temps: list, limit: int | None) -> None:
    try:
        with zipfile.ZipFile(archive) as zf:
            infos = zf.infolist()
            for info in infos:  # check everything before writing anything
                name = safe_member_name(info.filename)
                if stat.S_ISLNK(info.external_attr >> 16):
                    _check_link(name, zf.read(info).decode("utf-8", "replace"), hard=False)
            for info in infos:
                name = safe_member_name(info.filename)
                dests = [] if info.is_dir() or stat.S_ISLNK(info.external_attr >> 16) else select(name)
                if dests:
                    with zf.open(info) as src:
                        _copy_to(src, name, dests, written, temps, limit)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, zlib.error) as e:
        raise TxlError(f"{archive} is a corrupt zip archive ({e}); download it again") from None


def _extract_tar(archive: Path, select, written: dict, temps: list, limit: int | None) -> None:
    opener = {"gz": gzip.open, "bz2": bz2.open, "xz": lzma.open}.get(_kind(archive), open)
    try:
        with opener(archive, "rb") as raw, tarfile.open(fileobj=raw, mode="r|") as tf:  # one streaming pass
            for member in tf:
                name = safe_member_name(member.name)
                if member.issym() or member.islnk():
                    _check_link(name, member.linkname, hard=member.islnk())
                    continue
                if not member.isfile():
                    continue
                dests = select(name)
                if dests:
                    src = tf.extractfile(member)
                    if src is None:
                        raise TxlError(f"archive member {name!r} of {archive} cannot be read")
                    _copy_to(src, name, dests, written, temps, limit)
            while raw.read(CHUNK):  # read to the end: a truncated compressed stream raises EOFError here
                pass
    except (tarfile.TarError, EOFError, OSError, zlib.error, lzma.LZMAError) as e:
        raise TxlError(f"{archive} is a corrupt or truncated tar archive ({e}); download it again") from None
