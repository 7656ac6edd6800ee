"""Atomic output files: write to a hidden temp file beside the target, put it in place in one step.

What a user gets (tests/test_outputs.py checks each):
- A failed, interrupted or killed run leaves no partial output and never replaces a good one: the
  output is written to `.<name>.<pid>.<random>.tmp` beside it (a name too long for that is
  shortened to its first bytes and a hash) and moved into place only when
  complete. The temp file is removed when the run fails or is interrupted (Ctrl-C, SIGTERM: the
  CLI turns both into exceptions); one left by a run killed outright (SIGKILL, a crash) is swept by
  the next run that writes beside it, once its process no longer exists.
- Without --force an existing output is never replaced, and the check is made at the moment the
  output is put in place (a hard link, which fails when the name exists), so of two runs writing
  the same new output one wins and the other fails with a message; with --force the last one wins.
- A full disk or any other write error is a message naming the file, and leaves nothing behind.
- Files are created with the permissions of the umask, like any other file the user makes.
- Only regular files are replaced: an existing output that is a symbolic link, a device, a FIFO or
  a socket is refused even with --force (replacing /dev/stdout's link would break it for everyone),
  and --force replaces a non-empty directory only when `owned` recognises it as one odmactl wrote,
  so a mistyped path cannot delete a folder of other files.
- A command's outputs are committed together (`write_outputs`): each is written to its temp file
  first, then all are put in place in one step that a stop signal does not interrupt (core/stops.py);
  if one cannot be put in place, or a stop arrives meanwhile, those already placed are taken back
  (an output it replaced is restored from a hard link made before), so none is.
- `completed()` lists the outputs this process has put in place, so an interrupted command can say
  which of its outputs were already complete.
- Paths are made absolute first (without following links), so `.` and `..` name real directories.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import secrets
import shutil
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from odmactl.core import stops
from odmactl.core.errors import OutputError

_TEMP = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.[0-9a-f]{8}\.(?:tmp|old)$")


def absolute(path: Path) -> Path:
    """`path` made absolute with `.` and `..` resolved, links not followed."""
    return Path(os.path.abspath(path))


TEMP_NAME_EXTRA = len(".") + len(".4194304.0123abcd.tmp")  # what `_temp_name` adds to a stem, at most
_HASH_CHARS = len("~0123abcd")  # what `_temp_stem` adds to a shortened name


def _name_max(directory: Path) -> int:
    """The longest file name, in bytes, the file system holding `directory` takes."""
    try:
        return os.pathconf(directory if directory.is_dir() else "/", "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def _temp_stem(name: str, name_max: int) -> str:
    """The part of a temp name that stands for the output's `name`: the name itself when the temp
    name fits the file system, else its first bytes and a hash of the whole name (so that two long
    names sharing a beginning still have different temp names, and `sweep_stale` finds its own)."""
    raw = os.fsencode(name)
    if len(raw) + TEMP_NAME_EXTRA <= name_max:
        return name
    keep = raw[:name_max - TEMP_NAME_EXTRA - _HASH_CHARS].decode("utf-8", errors="ignore")
    return f"{keep}~{hashlib.sha1(raw).hexdigest()[:8]}"


PATH_MAX = os.pathconf("/", "PC_PATH_MAX") if hasattr(os, "pathconf") else 4096  # bytes, with the final NUL


def _check_name(path: Path) -> None:
    """A name the file system takes (its temp names are shortened to fit: `_temp_stem`), in a
    path the system takes (checked first: a longer one fails every file operation)."""
    size = len(os.fsencode(str(path))) + TEMP_NAME_EXTRA + 1  # the temp file's path is at most this long
    if size > PATH_MAX:
        raise OutputError(f"the path is {len(os.fsencode(str(path))):,} bytes; with its temp name's {TEMP_NAME_EXTRA} "
                          f"it passes the {PATH_MAX - 1:,} bytes this system takes for a path", file=path,
                          hint="write it in a directory with a shorter path")
    name_max = _name_max(path.parent)
    size = len(os.fsencode(path.name))
    if size > name_max:
        raise OutputError(f"the file name is {size} bytes, and this file system takes names of at most {name_max}",
                          file=path, hint=f"a name of at most {name_max} bytes")


def check_writable(path: Path, *, force: bool) -> None:
    """Fail before any expensive work if `path` cannot be (over)written."""
    path = absolute(path)
    _check_name(path)
    if path.is_symlink():
        raise OutputError("is a symbolic link; odmactl replaces only regular files, never a link", file=path,
                          hint="give the path of a regular file")
    if path.is_dir():
        raise OutputError("is a directory, expected a file path", file=path)
    if path.exists():
        if not path.is_file():
            raise OutputError("exists and is not a regular file (a device, FIFO or socket); odmactl will not "
                              "replace it", file=path, hint="choose another output path")
        if not force:
            raise OutputError("already exists", file=path, hint="pass --force to replace it")
    _check_parent(path)


def check_writable_dir(path: Path, *, force: bool, owned: Callable[[Path], str | None]) -> None:
    """Fail before any expensive work if directory `path` cannot be written (or replaced); with
    `force` a non-empty directory is replaced only when `owned(path)` finds nothing wrong (it
    returns None for a directory odmactl wrote, else why it is not one)."""
    path = absolute(path)
    _check_name(path)
    if path.is_symlink():
        raise OutputError("is a symbolic link; odmactl replaces only a directory it wrote, never a link", file=path,
                          hint="give the directory's own path")
    if path.exists() and not path.is_dir():
        raise OutputError("exists and is not a directory", file=path)
    if path.is_dir() and any(path.iterdir()):
        if not force:
            raise OutputError("already exists and is not empty", file=path, hint="pass --force to replace it")
        problem = owned(path)
        if problem is not None:
            raise OutputError(f"is not empty and {problem}: odmactl replaces only a directory it wrote, never one "
                              "of other files, even with --force", file=path, hint="choose a new or empty directory")
    if path.parent == path:
        raise OutputError("is the root directory", file=path, hint="choose a new or empty directory")
    _check_parent(path)


def _check_parent(path: Path) -> None:
    parent = path.parent
    if not parent.is_dir():
        raise OutputError("the output directory does not exist", file=path)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError("the output directory is not writable", file=path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def sweep_stale(path: Path) -> list[Path]:
    """Remove the temp files and directories of earlier runs writing `path` whose process is gone;
    returns what was removed."""
    removed = []
    parent = path.parent
    stem = _temp_stem(path.name, _name_max(parent))
    try:
        siblings = list(parent.iterdir())
    except OSError:
        return removed
    for sibling in siblings:
        match = _TEMP.match(sibling.name)
        if match is None or match["name"] != stem or int(match["pid"]) == os.getpid() or _alive(int(match["pid"])):
            continue
        if sibling.is_dir() and not sibling.is_symlink():
            shutil.rmtree(sibling, ignore_errors=True)
        else:
            sibling.unlink(missing_ok=True)
        removed.append(sibling)
    return removed


def _temp_name(path: Path, suffix: str) -> Path:
    stem = _temp_stem(path.name, _name_max(path.parent))
    return path.with_name(f".{stem}.{os.getpid()}.{secrets.token_hex(4)}.{suffix}")


_COMPLETED: list[Path] = []


def completed() -> list[Path]:
    """The outputs this command has put in place, in order (since `forget_completed`)."""
    return list(_COMPLETED)


def forget_completed() -> None:
    """Start a new command's list (the CLI runs one command per call, tests many per process)."""
    _COMPLETED.clear()


def _no_space(exc: BaseException) -> bool:
    """A full disk, as an OSError or as a library's own error (polars, safetensors) that wraps it."""
    return getattr(exc, "errno", None) == errno.ENOSPC or "No space left on device" in str(exc) or \
        "os error 28" in str(exc)


def _is_write_error(exc: BaseException) -> bool:
    """Whether `exc`, raised while an output was written or put in place, is the file system's
    (any OSError, or a full disk a library reports its own way) rather than odmactl's or a signal."""
    return isinstance(exc, OSError) or (isinstance(exc, Exception) and _no_space(exc))


def _write_error(path: Path, exc: BaseException) -> OutputError:
    if _no_space(exc):
        return OutputError("could not be written: no space left on the device; nothing was written", file=path)
    return OutputError(f"could not be written: {getattr(exc, 'strerror', None) or exc}; nothing was written", file=path)


def _put_in_place(tmp: Path, path: Path, force: bool) -> None:
    """Move the complete temp file to `path`: replacing it with `force`, else only if it does not
    exist at that moment."""
    if force:
        os.replace(tmp, path)
        return
    try:
        os.link(tmp, path)  # fails if `path` exists, whoever made it and whenever
    except FileExistsError:
        raise OutputError("already exists (another run wrote it while this one worked)", file=path,
                          hint="pass --force to replace it") from None
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
            raise
        if path.exists():  # a file system without hard links: the check and the rename are two steps
            raise OutputError("already exists", file=path, hint="pass --force to replace it") from None
        os.replace(tmp, path)
        return
    tmp.unlink()


@contextmanager
def atomic_output(path: Path, *, force: bool) -> Iterator[Path]:
    """Yield a temp path to write; on clean exit it takes `path`'s place (see the module docstring)."""
    path = absolute(path)
    check_writable(path, force=force)
    sweep_stale(path)
    tmp = _temp_name(path, "tmp")
    try:
        yield tmp
        if not tmp.exists():
            raise AssertionError(f"nothing was written to {tmp}")
        _put_in_place(tmp, path, force)
        _COMPLETED.append(path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if _is_write_error(exc):
            raise _write_error(path, exc) from None
        raise


@contextmanager
def atomic_output_dir(path: Path, *, force: bool, owned: Callable[[Path], str | None]) -> Iterator[Path]:
    """Yield a temp directory to fill (`owned` must then accept it); on clean exit it takes `path`'s
    place. Without `force` the rename fails if a non-empty directory took the name meanwhile; with it
    an existing directory is moved aside first and removed only once the new one is in place."""
    path = absolute(path)
    check_writable_dir(path, force=force, owned=owned)
    sweep_stale(path)
    tmp = _temp_name(path, "tmp")
    tmp.mkdir()
    old = None
    try:
        yield tmp
        if force and path.exists():
            old = _temp_name(path, "old")
            os.replace(path, old)
        try:
            os.rename(tmp, path)  # onto an empty directory or none; a non-empty one refuses
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                raise OutputError("already exists (another run wrote it while this one worked)", file=path,
                                  hint="pass --force to replace it") from None
            raise
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and old.exists() and not path.exists():  # put the old one back (if it was moved)
            os.replace(old, path)
        if _is_write_error(exc):
            raise _write_error(path, exc) from None
        raise
    _COMPLETED.append(path)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


Writer = Callable[[Path], None]  # writes an output's whole content to the (temp) path it is given


def write_outputs(outputs: Sequence[tuple[Path, Writer]], *, force: bool) -> None:
    """Write every (path, writer) of one command, then put them all in place together (see the
    module docstring): on any failure or stop before the last is in place, none is."""
    targets = [absolute(path) for path, _ in outputs]
    if len(set(targets)) < len(targets):
        raise OutputError("is given for two outputs of one command", file=next(p for p in targets if targets.count(p) > 1))
    for path in targets:
        check_writable(path, force=force)
        sweep_stale(path)
    temps: list[Path] = []
    try:
        for path, (_, write) in zip(targets, outputs):
            temps.append(_temp_name(path, "tmp"))
            try:
                write(temps[-1])
                if not temps[-1].exists():
                    raise AssertionError(f"nothing was written to {temps[-1]}")
            except BaseException as exc:
                if _is_write_error(exc):
                    raise _write_error(path, exc) from None
                raise
        with stops.deferred():
            _commit(list(zip(temps, targets)), force)
    except BaseException:
        with stops.deferred():  # every temp goes; a second stop meanwhile is the same stop (dropped, core/stops.py)
            _remove(temps)
            raise
    with stops.deferred():  # committed: the temps were moved into place, none should be left
        _remove(temps)


def _remove(temps: list[Path]) -> None:
    for tmp in temps:
        tmp.unlink(missing_ok=True)


def _kept_aside(path: Path) -> Path:
    """A hidden copy of the output `path` is about to replace (a hard link; a copy on a file system
    without them), so that it can be put back."""
    kept = _temp_name(path, "old")
    try:
        os.link(path, kept)
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
            raise
        shutil.copy2(path, kept)
    return kept


def _commit(pairs: list[tuple[Path, Path]], force: bool) -> None:
    """Put each complete temp file in place; an output replaced is first hard-linked aside, so that
    a failure or a stop (`stops.pending`) before the last is in place takes every one back."""
    placed: list[tuple[Path, Path | None]] = []  # (output, the hard link to what it replaced, or None)
    try:
        for tmp, path in pairs:
            if stops.pending() is not None:
                raise stops.Stopped(stops.pending())
            kept = _kept_aside(path) if force and path.exists() else None
            try:
                _put_in_place(tmp, path, force)
            except BaseException:
                if kept is not None:
                    kept.unlink(missing_ok=True)
                raise
            placed.append((path, kept))
    except BaseException as exc:
        for path, kept in reversed(placed):
            if kept is not None:
                os.replace(kept, path)
            else:
                path.unlink(missing_ok=True)
        if _is_write_error(exc):
            raise _write_error(path, exc) from None
        raise
    for path, kept in placed:
        if kept is not None:
            kept.unlink(missing_ok=True)
        _COMPLETED.append(path)
