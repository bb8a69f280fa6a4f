"""Writing and reading files in places another local user may have tampered with.

healthkit often runs as root and writes files at paths it does not choose: the torchelastic
error file (``TORCHELASTIC_ERROR_FILE``) and the helpers' exception records (a per-user
directory under ``/tmp`` by default). Another user who can write to a parent directory could
plant a symlink, a FIFO or a hard link there. So every path is resolved here, one component
at a time, from a directory fd:

- each component is opened with ``O_NOFOLLOW|O_DIRECTORY`` relative to the previous one, so
  nothing is swapped between a check and its use;
- a symlink is followed only when it is owned by this user or root: another user cannot
  create a symlink owned by either, so a planted one is refused, not followed;
- a component that is not a directory (a FIFO, a file) is refused without opening it for
  reading (``O_NONBLOCK`` as well, so a FIFO can never block us);
- the final directory must be owned by this user or root and not writable by everyone
  without the sticky bit (another user could then replace the file after it was written);
- the file is written to a temp file with a random name, created
  ``O_CREAT|O_EXCL|O_NOFOLLOW``, and renamed over the target: a FIFO or symlink at the target
  refuses the write, and a planted hard link is replaced, never written through.

Both writers (:mod:`healthkit._actions` and :mod:`healthkit._diagnose.records`) use this module.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat

__all__ = ["UnsafePathError", "kind", "open_directory", "read_private", "write_atomic",
           "write_file"]

_MAX_SYMLINKS = 40  # the kernel's own limit (MAXSYMLINKS)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class UnsafePathError(Exception):
    """A path failed a safety check; the message says which component and why."""


def kind(mode: int) -> str:
    """What a file of this mode is, in words ("a FIFO", "a directory", ...)."""
    for test, name in (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISLNK, "a symlink"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _trusted(uid: int) -> bool:
    return uid in (os.geteuid(), 0)


def open_directory(path: str, *, create: bool = False, private: bool = False) -> int:
    """Open the directory ``path`` without following a symlink another user could have
    planted at any component; returns an fd the caller closes.

    ``create=True`` makes missing components (mode 0700). ``private=True`` requires the
    final directory to be owned by this user (not root on another user's behalf) and
    writable by nobody else. Raises :class:`UnsafePathError`.
    """
    if not path:
        raise UnsafePathError("the path is empty")
    todo = [p for p in path.split("/") if p not in ("", ".")]
    todo.reverse()  # a stack: the next component is last
    fd = os.open("/" if path.startswith("/") else ".", _DIR_FLAGS & ~os.O_NOFOLLOW)
    shown = "/" if path.startswith("/") else ""
    links = 0
    try:
        while todo:
            name = todo.pop()
            here = os.path.join(shown, name) if shown else name
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                if not create:
                    raise UnsafePathError(f"{here!r} does not exist") from None
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o700, dir_fd=fd)
                todo.append(name)  # look again: made by us, or by a racing creator
                continue
            except OSError as e:
                raise UnsafePathError(f"cannot inspect {here!r} ({e.strerror})") from None
            if stat.S_ISLNK(st.st_mode):
                links += 1
                if links > _MAX_SYMLINKS:
                    raise UnsafePathError(f"more than {_MAX_SYMLINKS} symlinks in {path!r}")
                if not _trusted(st.st_uid):
                    raise UnsafePathError(
                        f"{here!r} is a symlink owned by uid {st.st_uid}, neither this user "
                        "nor root: another user may have planted it, so it is not followed"
                    )
                target = os.readlink(name, dir_fd=fd)
                parts = [p for p in target.split("/") if p not in ("", ".")]
                todo.extend(reversed(parts))
                if target.startswith("/"):
                    os.close(fd)
                    fd = os.open("/", _DIR_FLAGS & ~os.O_NOFOLLOW)
                    shown = "/"
                continue
            if not stat.S_ISDIR(st.st_mode):
                raise UnsafePathError(f"{here!r} is {kind(st.st_mode)}, not a directory")
            try:
                new = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as e:  # swapped for a symlink or a non-directory since the stat
                raise UnsafePathError(f"cannot open {here!r} ({e.strerror})") from None
            os.close(fd)
            fd = new
            shown = here
        _check_final(fd, path, private)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_final(fd: int, path: str, private: bool) -> None:
    st = os.fstat(fd)
    me = os.geteuid()
    if private:
        if st.st_uid != me:
            raise UnsafePathError(
                f"{path!r} is owned by uid {st.st_uid}, not by this user (uid {me}): another "
                "user may have made it to read or replace what is written there"
            )
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise UnsafePathError(
                f"{path!r} is writable by other users (mode {stat.S_IMODE(st.st_mode):o}); "
                "it must be private to this user"
            )
        return
    if not _trusted(st.st_uid):
        raise UnsafePathError(
            f"its directory {path!r} is owned by uid {st.st_uid}, neither this user nor root, "
            "so that user could replace the file"
        )
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        raise UnsafePathError(
            f"its directory {path!r} is writable by every user and has no sticky bit, so "
            "another user could replace the file"
        )


def write_atomic(dir_fd: int, name: str, data: bytes, *, mode: int = 0o644,
                 shown: str | None = None) -> None:
    """Put ``data`` at ``name`` in the directory ``dir_fd``: a temp file with a random name,
    then a rename over the target. Refuses (:class:`UnsafePathError`) a target that exists
    and is not a regular file or belongs to another user; never leaves a temp file."""
    shown = shown or name
    if not name or "/" in name or name in (".", ".."):
        raise UnsafePathError(f"{shown!r} names a directory, not a file")
    _check_target(dir_fd, name, shown)
    tmp = f".{name}.healthkit-{secrets.token_hex(8)}.tmp"
    fd = os.open(
        tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode,
        dir_fd=dir_fd,
    )
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        _check_target(dir_fd, name, shown)  # again, just before the rename: it may have changed
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise


def _check_target(dir_fd: int, name: str, shown: str) -> None:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePathError(f"{shown!r} exists and is not a regular file ({kind(st.st_mode)})")
    if not _trusted(st.st_uid):
        raise UnsafePathError(
            f"{shown!r} exists and belongs to uid {st.st_uid}, neither this user nor root; "
            "another user's file is not replaced"
        )


def write_file(path: str, data: bytes, *, mode: int = 0o644) -> None:
    """Atomically write ``data`` at ``path`` under the rules of this module. A symlink at
    ``path`` itself is followed when it is owned by this user or root (a launcher may point
    the error file through one); one owned by anyone else is refused."""
    for _ in range(_MAX_SYMLINKS):
        directory, base = os.path.split(path)
        if not base:
            raise UnsafePathError(f"{path!r} names a directory, not a file")
        dir_fd = open_directory(directory or ".")
        try:
            try:
                st = os.stat(base, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            if st is not None and stat.S_ISLNK(st.st_mode):
                if not _trusted(st.st_uid):
                    raise UnsafePathError(
                        f"{path!r} is a symlink owned by uid {st.st_uid}, neither this user "
                        "nor root"
                    )
                path = os.path.join(directory, os.readlink(base, dir_fd=dir_fd))
                continue
            write_atomic(dir_fd, base, data, mode=mode, shown=path)
            return
        finally:
            os.close(dir_fd)
    raise UnsafePathError(f"more than {_MAX_SYMLINKS} symlinks")


def read_private(dir_fd: int, name: str, limit: int) -> bytes | None:
    """The first ``limit`` bytes of the regular file ``name`` in ``dir_fd`` if it belongs to
    this user; ``None`` for anything else (missing, a symlink, a FIFO, another user's)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=dir_fd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return None
        chunks = []
        left = limit
        while left > 0:
            chunk = os.read(fd, min(left, 65536))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)
