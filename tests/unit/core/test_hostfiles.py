"""The strict host-file reader and number parser (accel_core.hostfiles).

Expected values come from the definitions the module promises: ASCII decimal digits (0x30-0x39) only, an optional
'-' only where negatives are allowed, the kernel's trailing newline tolerated, one page at most, regular files only.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from accel_core.hostfiles import (
    MAX_ATTR_BYTES,
    HostValueError,
    is_missing,
    parse_hex,
    parse_index,
    parse_int,
    printable,
    read_attr,
    read_attr_bytes,
    read_int,
    read_label,
)

# characters for which str.isdigit() is True (and some for which int() succeeds) but that are not ASCII digits
NOT_ASCII_DIGITS = ["²", "１２", "٣", "𝟘", "৪", "⑦"]


@pytest.mark.parametrize("text", [*NOT_ASCII_DIGITS, "+5", "1_000", "1 2", "\u20035", "5\u2003", "0x10", "1.0",
                                  "", "\n", "-", "--1", "1e3", "12345678901234567890123", str(2**64)])
def test_parse_int_rejects_everything_but_ascii_digits(text: str) -> None:
    with pytest.raises(HostValueError) as err:
        parse_int(text, "/sys/x/core_count")
    assert str(err.value).startswith("/sys/x/core_count: ")


def test_isdigit_would_have_said_yes() -> None:
    """The defect this guards against: isdigit() accepts these, and int() then crashes or reads a wrong value."""
    assert all(t.isdigit() for t in NOT_ASCII_DIGITS)
    with pytest.raises(ValueError):
        int("²")


@pytest.mark.parametrize(("text", "value"), [("0", 0), ("42\n", 42), (" 7 \n", 7), ("\t9", 9), ("007", 7),
                                             (str(2**64 - 1), 2**64 - 1)])
def test_parse_int_accepts_kernel_output(text: str, value: int) -> None:
    assert parse_int(text, "f") == value
    assert parse_int(text.encode(), "f") == value


def test_negative_only_where_allowed_and_bounds() -> None:
    assert parse_int("-1\n", "numa_node", minimum=-1) == -1
    with pytest.raises(HostValueError, match="ASCII digits only"):
        parse_int("-1", "numa_node")
    with pytest.raises(HostValueError, match="outside 1..8"):
        parse_int("9", "core_count", minimum=1, maximum=8)
    with pytest.raises(HostValueError, match="expected an integer"):
        parse_int(b"\xff\xfe", "f")


def test_parse_hex() -> None:
    assert parse_hex("0x1d0f\n", "vendor") == 0x1D0F
    for bad in ("1d0f", "0x", "0x１", "0x1d0f0x", "0xg", "0x" + "f" * 17):
        with pytest.raises(HostValueError):
            parse_hex(bad, "vendor")


@pytest.mark.parametrize(("name", "prefix", "value"), [
    ("uverbs12", "uverbs", 12), ("uverbs0", "uverbs", 0), ("1", "", 1), ("neuron-device-15", "neuron-device-", 15),
    ("uverbs012", "uverbs", None), ("uverbs²", "uverbs", None), ("uverbs１", "uverbs", None),
    ("uverbs-1", "uverbs", None), ("uverbs", "uverbs", None), ("uverbs1 ", "uverbs", None), ("²", "", None),
    ("x1", "uverbs", None), ("99999999999", "", None),
])
def test_parse_index(name: str, prefix: str, value: int | None) -> None:
    assert parse_index(name, prefix) == value


def test_read_attr_of_ordinary_and_odd_files(tmp_path: Path) -> None:
    (tmp_path / "n").write_text("5\n")
    assert read_int(str(tmp_path / "n")) == 5
    (tmp_path / "utf").write_bytes("Trainium2 ²\n".encode())
    assert read_attr(str(tmp_path / "utf")) == "Trainium2 ²"
    (tmp_path / "bin").write_bytes(b"\xff\xfe\n")
    with pytest.raises(HostValueError, match="not UTF-8"):
        read_attr(str(tmp_path / "bin"), "/sys/bin")


def test_missing_is_told_apart(tmp_path: Path) -> None:
    with pytest.raises(HostValueError, match=": missing") as err:
        read_attr_bytes(str(tmp_path / "absent"), "/sys/absent")
    assert is_missing(err.value)
    (tmp_path / "dir").mkdir()
    with pytest.raises(HostValueError, match="unreadable \\(a directory\\)") as err:
        read_attr_bytes(str(tmp_path / "dir"))
    assert not is_missing(err.value)


@pytest.mark.timeout(10)
def test_fifo_loop_device_and_huge_file_are_errors_not_hangs(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(HostValueError, match="not a regular file"):
        read_attr_bytes(str(fifo))  # a plain open() would block until a writer appears
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(HostValueError, match="loop of symbolic links"):
        read_attr_bytes(str(tmp_path / "a"))
    (tmp_path / "zero").symlink_to("/dev/zero")
    with pytest.raises(HostValueError, match="not a regular file"):
        read_attr_bytes(str(tmp_path / "zero"))
    (tmp_path / "big").write_bytes(b"1" * (MAX_ATTR_BYTES + 1))
    with pytest.raises(HostValueError, match="larger than"):
        read_int(str(tmp_path / "big"))
    (tmp_path / "page").write_bytes(b"1" * 20)
    assert read_int(str(tmp_path / "page")) == int("1" * 20)


def test_read_label(tmp_path: Path) -> None:
    (tmp_path / "v").write_text("2.21.37.0\n")
    assert read_label(str(tmp_path / "v")) == "2.21.37.0"
    (tmp_path / "long").write_text("x" * 65)
    (tmp_path / "ctl").write_text("a\x1bb")
    for name in ("long", "ctl"):
        with pytest.raises(HostValueError, match="not a short printable value"):
            read_label(str(tmp_path / name), f"/sys/module/neuron/{name}")


def test_printable_escapes_what_cannot_be_printed() -> None:
    assert printable("0000:10:00.0") == "0000:10:00.0"
    raw_name = b"ab\xffc".decode("utf-8", "surrogateescape")  # how os.listdir hands over a non-UTF-8 name
    assert printable(raw_name) == "ab\\xffc"
    assert printable("a\nb") == "a\\nb"
    assert printable("²") == "\\xb2"
    printable(raw_name).encode("ascii")  # always encodable
