"""Strict reads of small host files (sysfs, procfs, /opt) and the one number parser for everything read from the host.

Every number a daemon takes from the host goes through :func:`parse_int` / :func:`parse_hex` (file contents) or
:func:`parse_index` (directory names such as ``uverbs3`` or a port ``1``). They accept ASCII digits only:
``str.isdigit()`` and ``int()`` also take ``²``, full-width ``１``, Arabic-Indic ``٣``, ``+5``, ``1_000`` and
Unicode spaces, and some of those crash ``int()`` after ``isdigit()`` said yes.

:func:`read_attr` reads at most one page from a regular file, so a file replaced by a FIFO, a directory, a link to
``/dev/zero`` or a loop of symlinks is an error naming the path, never a hang or a huge read. Errors are
:class:`HostValueError` (a ``ValueError``) whose message starts with the path as the node names it; callers turn it
into a per-device problem and keep the other devices.
"""

from __future__ import annotations

import errno
import os
import re
import stat

#: sysfs attributes are at most one page; anything longer is not what the kernel wrote
MAX_ATTR_BYTES = 4096
#: unsigned 64-bit: the widest kernel counter
U64_MAX = 2**64 - 1
INT64_MIN = -(2**63)

_DEC = re.compile(r"-?[0-9]{1,20}", re.ASCII)
_HEX = re.compile(r"0[xX][0-9a-fA-F]{1,16}", re.ASCII)
_ASCII_SPACE = " \t\n\r"


class HostValueError(ValueError):
    """A host file or name is unreadable or malformed; the message names the path (as seen on the node)."""


def describe(text: str, limit: int = 40) -> str:
    """A short, printable quote of a bad value for an error message."""
    shown = text if len(text) <= limit else text[:limit] + "..."
    return repr(shown)


def printable(name: str) -> str:
    """``name`` itself when it is printable ASCII, else an escaped form (non-UTF-8 bytes of a file name arrive as
    lone surrogates, which would break ``print`` and every encoder downstream)."""
    if name.isascii() and name.isprintable():
        return name
    text = name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")  # bad bytes: \\xff
    return "".join(c if c.isascii() and c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)


def _text(value: bytes | str) -> str:
    """File bytes as text for matching and messages; the patterns are ASCII, so anything else fails them."""
    return value if isinstance(value, str) else value.decode("utf-8", "replace")


def parse_int(value: bytes | str, where: str, *, minimum: int = 0, maximum: int = U64_MAX) -> int:
    """A decimal integer in ``minimum..maximum``; surrounding ASCII whitespace (the kernel's newline) is allowed.

    ``minimum`` below 0 allows a leading ``-``; nothing else (no ``+``, no ``_``, no non-ASCII digits).
    ``where`` names the file or field in the error.
    """
    text = _text(value)
    body = text.strip(_ASCII_SPACE)
    if not body:
        raise HostValueError(f"{where}: expected an integer, got an empty file")
    if not _DEC.fullmatch(body) or (body.startswith("-") and minimum >= 0):
        digits = "an optional '-' and ASCII digits" if minimum < 0 else "ASCII digits only"
        raise HostValueError(f"{where}: expected an integer ({digits}), got {describe(text)}")
    number = int(body)
    if not minimum <= number <= maximum:
        raise HostValueError(f"{where}: {number} is outside {minimum}..{maximum}")
    return number


def parse_hex(value: bytes | str, where: str, *, maximum: int = U64_MAX) -> int:
    """A ``0x``-prefixed hexadecimal number (PCI vendor/device/class files)."""
    text = _text(value)
    body = text.strip(_ASCII_SPACE)
    if not _HEX.fullmatch(body):
        raise HostValueError(f"{where}: not a 0x-prefixed hexadecimal number ({describe(text)})")
    number = int(body, 16)
    if number > maximum:
        raise HostValueError(f"{where}: {body} is larger than {maximum:#x}")
    return number


def parse_index(name: str, prefix: str = "", *, maximum: int = 1 << 20) -> int | None:
    """``uverbs12`` with prefix ``uverbs`` -> 12; None unless the rest is canonical ASCII decimal (no sign, no
    leading zero) up to ``maximum``. For directory entry names and device IDs, where a name that does not match is
    simply not one of ours."""
    if not name.startswith(prefix):
        return None
    tail = name[len(prefix):]
    if not tail or len(tail) > 8 or not tail.isascii() or not tail.isdecimal():
        return None
    if tail != "0" and tail.startswith("0"):
        return None
    number = int(tail)
    return number if number <= maximum else None


def read_attr_bytes(path: str, shown: str | None = None, *, limit: int = MAX_ATTR_BYTES) -> bytes:
    """The bytes of a small regular file (at most ``limit``, one page by default).

    Raises HostValueError naming ``shown`` (default ``path``) for anything else: missing, unreadable, a
    directory, a FIFO or device, a symlink loop, too large. ``FileNotFoundError`` is kept as the cause so callers
    can tell "absent" from "broken" with :func:`is_missing`.
    """
    where = shown or path
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        raise _os_error(where, exc) from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise HostValueError(f"{where}: unreadable ({kind})")
        try:
            data = os.read(fd, limit + 1)
        except OSError as exc:
            raise _os_error(where, exc) from exc
    finally:
        os.close(fd)
    if len(data) > limit:
        raise HostValueError(f"{where}: unreadable (larger than {limit} bytes)")
    return data


def read_attr(path: str, shown: str | None = None) -> str:
    """Stripped UTF-8 text of a small regular file; HostValueError naming the path otherwise."""
    data = read_attr_bytes(path, shown)
    try:
        return data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise HostValueError(f"{shown or path}: not UTF-8 text") from None


def read_label(path: str, shown: str | None = None, *, max_length: int = 64) -> str:
    """A short identifier-like value (a version, a device name): printable ASCII of at most ``max_length``
    characters after stripping, so it can go into a label or a ResourceSlice attribute as it is."""
    text = read_attr(path, shown)
    if len(text) > max_length or not text.isascii() or not text.isprintable():
        raise HostValueError(f"{shown or path}: not a short printable value ({describe(text)})")
    return text


def read_int(path: str, shown: str | None = None, *, minimum: int = 0, maximum: int = U64_MAX) -> int:
    """A decimal integer file (see :func:`parse_int`)."""
    return parse_int(read_attr_bytes(path, shown), shown or path, minimum=minimum, maximum=maximum)


def read_hex(path: str, shown: str | None = None, *, maximum: int = U64_MAX) -> int:
    """A ``0x...`` file such as a PCI ``vendor`` (see :func:`parse_hex`)."""
    return parse_hex(read_attr_bytes(path, shown), shown or path, maximum=maximum)


def is_missing(exc: BaseException) -> bool:
    """True when a HostValueError (or OSError) means the file simply does not exist."""
    cause = exc.__cause__ if isinstance(exc, HostValueError) else exc
    return isinstance(cause, OSError) and cause.errno == errno.ENOENT


def _os_error(where: str, exc: OSError) -> HostValueError:
    if exc.errno == errno.ENOENT:
        return HostValueError(f"{where}: missing")
    reasons = {errno.ELOOP: "a loop of symbolic links", errno.EISDIR: "a directory"}
    reason = reasons.get(exc.errno or 0) or exc.strerror or type(exc).__name__
    return HostValueError(f"{where}: unreadable ({reason})")
