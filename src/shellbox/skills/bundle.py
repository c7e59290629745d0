"""Skill bundles: validate and unpack a zip or a folder upload into a fresh directory.

A bundle is a folder with ``SKILL.md`` at its root: YAML front matter between ``---`` lines
holding ``name`` (a short slug, used as the mount directory ``/mnt/skills/<name>``) and
``description``, then the instructions; scripts and assets sit beside it.

Nothing in an upload is trusted: entry names are normalised and refused when they escape the
folder, symlinks and device entries are refused, and every cap (files, bytes per file, bytes
in all, expansion ratio) is counted on the bytes actually written while unpacking, never taken
from a zip's headers, so a lying header or a zip bomb stops at the cap instead of the disk.
Only stored and deflated entries are accepted: zipfile inflates them in bounded steps, while
its bzip2/lzma readers can expand one small read into hundreds of megabytes at once.

These functions only touch the destination directory they are given; the caller owns its
removal when they raise.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import stat
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import yaml

from shellbox.errors import InvalidRequest
from shellbox.settings import SkillSettings

SKILL_MD = "SKILL.md"
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
MAX_DESCRIPTION = 1024
MAX_FRONT_MATTER = 64 << 10
MAX_PATH = 1024
# Below this many unpacked bytes the expansion ratio is not checked: small text files
# (SKILL.md itself) legitimately compress very well.
RATIO_FLOOR_BYTES = 1 << 20
CHUNK = 1 << 16
FIXED_TIME = (1980, 1, 1, 0, 0, 0)  # folder uploads become zips that are the same every time
SUPPORTED_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflate"}
ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")


@dataclass(frozen=True)
class Caps:
    max_files: int
    max_file_bytes: int
    max_bundle_bytes: int
    max_expansion_ratio: int

    @classmethod
    def from_settings(cls, s: SkillSettings) -> Caps:
        return cls(s.max_files, s.max_file_bytes, s.max_bundle_bytes, s.max_expansion_ratio)


@dataclass(frozen=True)
class Manifest:
    """What a valid bundle holds."""

    name: str
    description: str
    files: int
    bytes: int  # unpacked


@dataclass(frozen=True)
class ZipUpload:
    file: IO[bytes]


@dataclass(frozen=True)
class FolderUpload:
    parts: Sequence[tuple[str, IO[bytes]]]  # (relative path, content)


BundleUpload = ZipUpload | FolderUpload


class BundleError(InvalidRequest):
    """A bundle the server refuses; the message says what to change."""


def _fail(msg: str, param: str) -> BundleError:
    return BundleError(msg, param=param)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.3g} MiB" if n >= 1 << 20 else f"{n} bytes"


# -- names ------------------------------------------------------------------------------------


def check_name(name: str, *, param: str) -> str:
    if not NAME_RE.match(name):
        msg = (
            f"skill name {name!r} is not a short slug: use 1-64 lowercase letters, digits, '-' "
            "or '_', starting with a letter or digit"
        )
        raise _fail(msg, param)
    return name


def entry_path(raw: str, *, param: str) -> str | None:
    """Normalise one entry name to ``a/b/c``; ``None`` for entries to skip (the root itself,
    macOS ``__MACOSX/`` and ``.DS_Store`` litter)."""
    name = raw.replace("\\", "/")  # zips made on Windows may use backslashes
    if any(ord(c) < 32 or c == "\x7f" for c in name):
        msg = f"entry {raw!r} has a control character in its name"
        raise _fail(msg, param)
    if name.startswith("/") or re.match(r"^[A-Za-z]:", name):
        msg = f"entry {raw!r} is an absolute path; entries must be relative to the skill folder"
        raise _fail(msg, param)
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        msg = f"entry {raw!r} contains '..' and would land outside the skill folder"
        raise _fail(msg, param)
    if not parts or parts[0] == "__MACOSX" or parts[-1] == ".DS_Store":
        return None
    if len(name.encode()) > MAX_PATH or any(len(p.encode()) > 255 for p in parts):
        msg = f"entry {raw[:80]!r}... has a name longer than {MAX_PATH} bytes"
        raise _fail(msg, param)
    return "/".join(parts)


def _common_root(paths: Sequence[str]) -> str:
    """The one top-level folder every path sits in, when SKILL.md is not at the root."""
    if not paths or SKILL_MD in paths or any("/" not in p for p in paths):
        return ""
    tops = {p.split("/", 1)[0] for p in paths}
    return f"{tops.pop()}/" if len(tops) == 1 else ""


def _check_layout(paths: Sequence[str], caps: Caps, *, param: str) -> None:
    if len(paths) > caps.max_files:
        msg = f"the bundle holds {len(paths)} files; a skill may hold at most {caps.max_files}"
        raise _fail(msg, param)
    seen: set[str] = set()
    for p in paths:
        if p in seen:
            msg = f"the bundle holds {p!r} twice"
            raise _fail(msg, param)
        seen.add(p)
    dirs: set[str] = set()
    for p in paths:
        parents = p.split("/")[:-1]
        dirs.update("/".join(parents[:i]) for i in range(1, len(parents) + 1))
    clash = sorted(seen & dirs)
    if clash:
        msg = f"{clash[0]!r} is both a file and a folder in the bundle"
        raise _fail(msg, param)
    if SKILL_MD not in seen:
        nested = sorted(p for p in paths if p.rsplit("/", 1)[-1] == SKILL_MD)
        hint = f" (found {nested[0]!r}; put it at the top of the folder)" if nested else ""
        msg = f"the bundle has no {SKILL_MD} at its root{hint}"
        raise _fail(msg, param)


# -- SKILL.md ---------------------------------------------------------------------------------


def parse_skill_md(data: bytes, *, param: str) -> tuple[str, str]:
    """``(name, description)`` from SKILL.md's YAML front matter."""
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError:
        msg = f"{SKILL_MD} is not valid UTF-8 text"
        raise _fail(msg, param) from None
    usage = "start it with '---', then 'name:' and 'description:' lines, then '---'"
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        msg = f"{SKILL_MD} has no YAML front matter; {usage}"
        raise _fail(msg, param)
    end = next((i for i, line in enumerate(lines[1:], 1) if line.strip() in ("---", "...")), 0)
    if not end:
        msg = f"the front matter of {SKILL_MD} is not closed by a '---' line; {usage}"
        raise _fail(msg, param)
    block = "\n".join(lines[1:end])
    if len(block) > MAX_FRONT_MATTER:
        msg = f"the front matter of {SKILL_MD} is longer than {MAX_FRONT_MATTER} characters"
        raise _fail(msg, param)
    try:
        meta = yaml.safe_load(block)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" (line {where.line + 2})" if where is not None else ""
        problem = getattr(exc, "problem", None) or "malformed YAML"
        msg = f"the front matter of {SKILL_MD} is not valid YAML{line}: {problem}"
        raise _fail(msg, param) from None
    if not isinstance(meta, dict):
        msg = f"the front matter of {SKILL_MD} must be a YAML mapping; {usage}"
        raise _fail(msg, param)
    name, description = meta.get("name"), meta.get("description")
    if name is None:
        msg = f"the front matter of {SKILL_MD} has no 'name'"
        raise _fail(msg, param)
    if not isinstance(name, str):
        msg = f"'name' in {SKILL_MD} must be a string, not {type(name).__name__}"
        raise _fail(msg, param)
    check_name(name, param=param)
    if not isinstance(description, str) or not description.strip():
        msg = f"the front matter of {SKILL_MD} needs a non-empty 'description' string"
        raise _fail(msg, param)
    description = description.strip()
    if len(description) > MAX_DESCRIPTION:
        msg = f"'description' in {SKILL_MD} is longer than {MAX_DESCRIPTION} characters"
        raise _fail(msg, param)
    return name, description


# -- writing ----------------------------------------------------------------------------------


class _Budget:
    """Counts the bytes actually written against the caps."""

    def __init__(self, caps: Caps, packed_bytes: int | None, param: str) -> None:
        self.caps = caps
        self.packed_bytes = packed_bytes  # the archive's real size; None for folder uploads
        self.param = param
        self.total = 0

    def add(self, rel: str, written: int, n: int, packed: int | None) -> None:
        caps, param = self.caps, self.param
        self.total += n
        if written > caps.max_file_bytes:
            msg = f"{rel!r} is larger than the {_mib(caps.max_file_bytes)} a skill file may hold"
            raise _fail(msg, param)
        if self.total > caps.max_bundle_bytes:
            msg = f"the bundle unpacks to more than the {_mib(caps.max_bundle_bytes)} allowed"
            raise _fail(msg, param)
        ratio = caps.max_expansion_ratio
        if packed is not None and written > RATIO_FLOOR_BYTES and written > ratio * packed:
            msg = (
                f"{rel!r} expands more than {ratio} times its packed size; the zip looks like a "
                "zip bomb"
            )
            raise _fail(msg, param)
        if (
            self.packed_bytes is not None
            and self.total > RATIO_FLOOR_BYTES
            and self.total > ratio * self.packed_bytes
        ):
            msg = f"the zip expands more than {ratio} times its size; it looks like a zip bomb"
            raise _fail(msg, param)


def _prepare_parent(root: Path, rel: str, made: set[Path]) -> Path:
    """Create the folders above ``root/rel``, readable and traversable by the sandbox user
    (mkdir alone would honour the server's umask)."""
    target = root / rel
    missing: list[Path] = []
    p = target.parent
    while p != root and p not in made:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        d.mkdir(exist_ok=True)
        os.chmod(d, 0o755)
        made.add(d)
    return target


def _open_new(path: Path) -> IO[bytes]:
    # O_EXCL|O_NOFOLLOW: the directory is fresh and ours, but never write through a link.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    return os.fdopen(fd, "wb")


def _finish_file(path: Path, executable: bool) -> None:
    os.chmod(path, 0o755 if executable else 0o644)


def _copy_capped(
    src: IO[bytes], path: Path, rel: str, budget: _Budget, packed: int | None, limit: int | None
) -> tuple[int, bytes]:
    """Copy ``src`` to a new file; returns (bytes written, first bytes). Stops past ``limit``."""
    written = 0
    head = b""
    with _open_new(path) as out:
        while True:
            want = CHUNK if limit is None else min(CHUNK, limit + 1 - written)
            if want <= 0:
                break
            data = src.read(want)
            if not data:
                break
            if not head:
                head = data[:2]
            written += len(data)
            budget.add(rel, written, len(data), packed)
            out.write(data)
    return written, head


def _zip_mode(info: zipfile.ZipInfo) -> int:
    return (info.external_attr >> 16) & 0xFFFF


def unpack_zip(
    source: Path | IO[bytes], packed_bytes: int, dest: Path, caps: Caps, *, param: str = "files"
) -> Manifest:
    """Validate a zip and unpack it into ``dest`` (created, must not exist)."""
    if packed_bytes > caps.max_bundle_bytes:
        cap = _mib(caps.max_bundle_bytes)
        msg = f"the zip is {_mib(packed_bytes)}; a skill may be at most {cap}"
        raise _fail(msg, param)
    try:
        zf = zipfile.ZipFile(source)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError, OSError) as exc:
        msg = f"the upload is not a valid zip archive ({exc})"
        raise _fail(msg, param) from None
    with zf:
        infos = zf.infolist()
        if len(infos) > 4 * caps.max_files + 16:
            msg = (
                f"the zip has {len(infos)} entries; a skill may hold at most {caps.max_files} files"
            )
            raise _fail(msg, param)
        files: list[tuple[str, zipfile.ZipInfo]] = []
        declared = 0
        for info in infos:
            rel = entry_path(info.orig_filename, param=param)
            kind = stat.S_IFMT(_zip_mode(info))
            label = repr(info.orig_filename)
            if kind == stat.S_IFLNK:
                msg = f"entry {label} is a symlink; skills may not contain symlinks"
                raise _fail(msg, param)
            if kind in (stat.S_IFCHR, stat.S_IFBLK):
                msg = f"entry {label} is a device file; skills may hold only files and folders"
                raise _fail(msg, param)
            if kind in (stat.S_IFIFO, stat.S_IFSOCK):
                msg = f"entry {label} is a pipe or socket; skills may hold only files and folders"
                raise _fail(msg, param)
            if rel is None or info.is_dir() or kind == stat.S_IFDIR:
                continue
            if info.flag_bits & 0x1:
                msg = f"entry {label} is encrypted; upload an unencrypted zip"
                raise _fail(msg, param)
            if info.compress_type not in SUPPORTED_METHODS:
                msg = (
                    f"entry {label} uses zip compression method {info.compress_type}; only "
                    "stored and deflate are supported"
                )
                raise _fail(msg, param)
            declared += info.file_size
            if info.file_size > caps.max_file_bytes:
                msg = (
                    f"entry {label} declares {_mib(info.file_size)}; a skill file may hold at "
                    f"most {_mib(caps.max_file_bytes)}"
                )
                raise _fail(msg, param)
            files.append((rel, info))
        if declared > caps.max_bundle_bytes:
            msg = (
                f"the zip declares {_mib(declared)} of files; a skill may hold at most "
                f"{_mib(caps.max_bundle_bytes)}"
            )
            raise _fail(msg, param)
        root = _common_root([rel for rel, _ in files])
        files = [(rel[len(root) :], info) for rel, info in files]
        _check_layout([rel for rel, _ in files], caps, param=param)

        dest.mkdir(mode=0o755)
        os.chmod(dest, 0o755)
        budget = _Budget(caps, packed_bytes, param)
        made: set[Path] = set()
        for rel, info in files:
            target = _prepare_parent(dest, rel, made)
            # The header's size is not trusted: ZipExtFile would stop (and check the CRC) at
            # ``file_size``, so lift that and let ``_copy_capped`` stop one byte past it.
            probe = copy.copy(info)
            probe.file_size = 1 << 62
            packed = min(info.compress_size, packed_bytes) or 1
            try:
                with zf.open(probe) as src:
                    written, head = _copy_capped(
                        src, target, rel, budget, packed, limit=info.file_size
                    )
            except zipfile.BadZipFile as exc:
                msg = f"entry {rel!r} is corrupt ({exc})"
                raise _fail(msg, param) from None
            except (EOFError, OSError, ValueError, NotImplementedError) as exc:
                msg = f"entry {rel!r} could not be unpacked ({exc})"
                raise _fail(msg, param) from None
            if written != info.file_size:
                more = "more than" if written > info.file_size else f"only {written} bytes, not"
                msg = (
                    f"entry {rel!r} holds {more} the {info.file_size} bytes its header "
                    "declares; the zip is corrupt or forged"
                )
                raise _fail(msg, param)
            _finish_file(target, bool(_zip_mode(info) & 0o111) or head == b"#!")
        name, description = parse_skill_md((dest / SKILL_MD).read_bytes(), param=param)
    return Manifest(name, description, len(files), budget.total)


def unpack_folder(
    parts: Sequence[tuple[str, IO[bytes]]], dest: Path, caps: Caps, *, param: str = "files"
) -> Manifest:
    """Validate a folder upload (relative path, content) and write it into ``dest``."""
    if len(parts) > caps.max_files:
        msg = f"the upload has {len(parts)} files; a skill may hold at most {caps.max_files}"
        raise _fail(msg, param)
    named: list[tuple[str, IO[bytes]]] = []
    for filename, content in parts:
        if not filename:
            msg = "every 'files[]' part needs a filename: the file's path inside the skill"
            raise _fail(msg, param)
        rel = entry_path(filename, param=param)
        if rel is not None:
            named.append((rel, content))
    root = _common_root([rel for rel, _ in named])
    named = [(rel[len(root) :], content) for rel, content in named]
    _check_layout([rel for rel, _ in named], caps, param=param)
    dest.mkdir(mode=0o755)
    os.chmod(dest, 0o755)
    budget = _Budget(caps, None, param)
    made: set[Path] = set()
    for rel, content in named:
        target = _prepare_parent(dest, rel, made)
        _, head = _copy_capped(content, target, rel, budget, None, limit=None)
        # Folder uploads carry no modes: a script with a shebang is made executable.
        _finish_file(target, head == b"#!")
    name, description = parse_skill_md((dest / SKILL_MD).read_bytes(), param=param)
    return Manifest(name, description, len(named), budget.total)


def build_zip(root: Path, out: Path) -> None:
    """Zip the folder ``root`` deterministically: sorted entries, fixed times and modes."""
    paths = sorted(
        str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and not p.is_symlink()
    )
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as zf:
        for rel in paths:
            mode = 0o755 if os.stat(root / rel).st_mode & 0o111 else 0o644
            info = zipfile.ZipInfo(rel, date_time=FIXED_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.create_system = 3
            info.external_attr = (stat.S_IFREG | mode) << 16
            with open(root / rel, "rb") as src, zf.open(info, "w") as dst:
                shutil.copyfileobj(src, dst, CHUNK)


def save_capped(src: IO[bytes], out: Path, cap: int, *, param: str = "files") -> int:
    """Copy an uploaded zip to ``out``, refusing it once it passes ``cap`` bytes."""
    size = 0
    with _open_new(out) as f:
        while data := src.read(CHUNK):
            size += len(data)
            if size > cap:
                msg = f"the zip is larger than the {_mib(cap)} a skill may be"
                raise _fail(msg, param)
            f.write(data)
    os.chmod(out, 0o600)
    return size


def stage(upload: BundleUpload, dest: Path, caps: Caps, *, param: str = "files") -> Manifest:
    """Write ``dest/bundle.zip`` (the bytes to serve back) and ``dest/files/`` (unpacked).

    A zip upload is kept byte for byte; a folder upload is zipped deterministically."""
    bundle = dest / "bundle.zip"
    if isinstance(upload, ZipUpload):
        size = save_capped(upload.file, bundle, caps.max_bundle_bytes, param=param)
        return unpack_zip(bundle, size, dest / "files", caps, param=param)
    manifest = unpack_folder(upload.parts, dest / "files", caps, param=param)
    build_zip(dest / "files", bundle)
    os.chmod(bundle, 0o600)
    return manifest


def classify(parts: Sequence[tuple[str, IO[bytes]]]) -> BundleUpload:
    """One part holding a zip is a zip upload; anything else is a folder of files."""
    if not parts:
        msg = (
            "send the skill as multipart/form-data: one 'files' part holding a zip, or one "
            "'files[]' part per file whose filename is its path inside the skill"
        )
        raise BundleError(msg, param="files")
    if len(parts) == 1:
        filename, content = parts[0]
        head = content.read(4)
        content.seek(0)
        if head in ZIP_MAGIC or filename.lower().endswith(".zip"):
            return ZipUpload(content)
    return FolderUpload(list(parts))
