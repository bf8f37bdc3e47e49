"""An export's files: regular files only, each written whole or not at all.

An export writes the path it was given and nothing else. A path where nothing is yet, or
a regular file (when told to overwrite it), is written under a temporary name beside it,
which is renamed over it once complete: a reader never sees half a file, and a crash
leaves the old file (and a stray `.NAME.*.partial`). Anything else at the path is
refused, overwrite or not, and left as it is: a symbolic link (dangling or not: it is not
followed, so the file it points to is not left stale while the link is replaced), a
named pipe, a directory, a device (`/dev/full`), a socket. To send an export to one of
those, export to `-` (standard output) and redirect it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

from artstore.errors import ExportTargetError

_KINDS = (
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def existing_file(path: Path) -> os.stat_result | None:
    """The status of the regular file at `path` (None: nothing there); anything else there
    is an ExportTargetError."""
    try:
        status = path.lstat()  # a link is looked at, not followed
    except FileNotFoundError:
        return None
    except NotADirectoryError:  # a folder on the way is something else
        on_the_way = (p for p in reversed(path.parents) if p.exists() and not p.is_dir())
        folder = next(on_the_way, path.parent)
        raise ExportTargetError(
            f"{folder} is not a directory, and {path} goes under it; nothing was written"
        ) from None
    if stat.S_ISREG(status.st_mode):
        return status
    kind = next((kind for test, kind in _KINDS if test(status.st_mode)), "not a regular file")
    hint = (
        "give the path of the file it points to"
        if stat.S_ISLNK(status.st_mode)
        else "export to - and redirect the output there"
    )
    raise ExportTargetError(
        f"{path} is {kind}: an export writes regular files only and follows no link; "
        f"nothing was written ({hint})"
    )


@contextlib.contextmanager
def written_in_place(path: Path) -> Iterator[Path]:
    """A new, empty file beside `path` for the block to write, renamed over `path` when
    the block ends without error, and removed when it does not.

    An existing regular file keeps its permissions; a new one gets the usual ones (the
    umask's). What is at `path` is looked at again just before the rename: it was refused
    before the work began, and is refused now if it changed meanwhile."""
    before = existing_file(path)
    partial = _create_beside(path)
    try:
        if before is not None:
            partial.chmod(stat.S_IMODE(before.st_mode))
        yield partial
        existing_file(path)
        os.replace(partial, path)
    except OSError as exc:  # no space left, a read-only file system...
        raise ExportTargetError(
            f"cannot write {path}: {exc.strerror or exc}; nothing was written"
        ) from None
    finally:
        partial.unlink(missing_ok=True)


def _create_beside(path: Path) -> Path:
    """A new, empty file beside `path`, made here and now (O_EXCL: never an existing one,
    never through a link)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    while True:
        partial = path.with_name(f".{path.name}.{secrets.token_hex(4)}.partial")
        try:
            os.close(os.open(partial, flags, 0o666))
        except FileExistsError:
            continue
        except OSError as exc:  # no such folder, a read-only file system...
            raise ExportTargetError(
                f"cannot write {path}: {exc.strerror or exc}; nothing was written"
            ) from None
        return partial
