"""Secrets read from files: `<VAR>_FILE=/path` instead of `<VAR>=value`, for every secret setting
(keys, tokens; the database URL, which may hold a password).

A value in a file stays out of the unit file, the environment file a deploy tool renders, `ps e`
and crash reports; the file's permissions say who may read it. So a file that its group or others
may read (or write: whoever can write it chooses the key) is refused, as is one that cannot be
read: paywire stops at startup naming the variable and the file, never running on a key someone
else may have seen or swapped. One trailing newline (what `echo` and editors add) is dropped.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path

SUFFIX = "_FILE"
MAX_BYTES = 64 * 1024  # a key is a line; anything larger is the wrong file
PRIVATE_MODES = "0400 or 0600"


class _Unusable(Exception):
    """Why a key file cannot be used: the end of a sentence that begins with its path."""


def file_variable(variable: str) -> str:
    return variable + SUFFIX


def read_key_files(env: Mapping[str, str], variables: Iterable[str]
                   ) -> tuple[dict[str, str], list[str]]:
    """`env` with each of `variables` whose `<VAR>_FILE` is set read from that file, and the
    problems (one sentence each, naming both variables or the file; never a value)."""
    values = dict(env)
    problems: list[str] = []
    for variable in variables:
        name = file_variable(variable)
        path = env.get(name)
        if not path:
            continue
        if env.get(variable):
            problems.append(f"{variable} and {name} are both set; set one of them ({name} names a "
                            "file holding the value)")
            continue
        try:
            values[variable] = read_key_file(Path(path))
        except _Unusable as exc:
            problems.append(f"{name} names {path}, which {exc}")
    return values, problems


def read_key_file(path: Path) -> str:
    """The value a key file holds, after checking it is a private regular file of sane size."""
    try:
        # O_NONBLOCK: a FIFO put there must not hang startup (it is refused below).
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise _Unusable(f"cannot be read ({exc.strerror}); create it (mode {PRIVATE_MODES}, owned by "
                        "the user paywire runs as) or fix the path") from None
    try:
        info = os.fstat(fd)  # of what was opened: nothing swapped between check and read
        if not stat.S_ISREG(info.st_mode):
            raise _Unusable("is not a regular file; put the value alone in a file")
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o077:
            raise _Unusable(f"is open to its group or others (mode {mode:04o}); run `chmod 600 "
                            f"{path}` (or 400), owned by the user paywire runs as")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(MAX_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        raise _Unusable(f"is larger than {MAX_BYTES} bytes; it must hold the value alone")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise _Unusable("is not UTF-8 text; it must hold the value alone, as text") from None
    text = text.removesuffix("\n").removesuffix("\r") if text.endswith("\n") else text
    if not text.strip():
        raise _Unusable("is empty; write the value into it")
    return text
