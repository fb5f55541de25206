"""A certificate's validity dates, read from its DER without a crypto library (the image carries none).

RFC 5280: ``Certificate ::= SEQUENCE { tbsCertificate, ... }`` and ``TBSCertificate ::= SEQUENCE { [0] version
OPTIONAL, serialNumber INTEGER, signature AlgorithmIdentifier, issuer Name, validity Validity, ... }`` with
``Validity ::= SEQUENCE { notBefore Time, notAfter Time }``; a Time is a UTCTime (tag 0x17, ``YYMMDDHHMMSSZ``, years
50-99 are 19xx) or a GeneralizedTime (tag 0x18, ``YYYYMMDDHHMMSSZ``). Anything else raises ValueError.
"""

from __future__ import annotations

import base64
import binascii
import calendar
import re

_PEM = re.compile(rb"-----BEGIN CERTIFICATE-----\s*(.+?)\s*-----END CERTIFICATE-----", re.S)
SEQUENCE, CONTEXT_0, UTC_TIME, GENERALIZED_TIME = 0x30, 0xA0, 0x17, 0x18


def first_pem_der(pem: bytes) -> bytes:
    """The DER of the first certificate block of a PEM file."""
    found = _PEM.search(pem)
    if found is None:
        raise ValueError("no PEM certificate block")
    try:
        return base64.b64decode(re.sub(rb"\s+", b"", found.group(1)), validate=True)
    except binascii.Error as exc:
        raise ValueError(f"bad base64 in the certificate block: {exc}") from None


def _element(der: bytes, at: int) -> tuple[int, int, int]:
    """(tag, start of content, end of content) of the DER element at ``at``."""
    if at + 2 > len(der):
        raise ValueError("truncated DER")
    tag, first = der[at], der[at + 1]
    at += 2
    if first < 0x80:
        length = first
    else:
        count = first & 0x7F
        if count == 0 or count > 4 or at + count > len(der):
            raise ValueError("bad DER length")
        length = int.from_bytes(der[at:at + count], "big")
        at += count
    if at + length > len(der):
        raise ValueError("truncated DER")
    return tag, at, at + length


def _time(tag: int, text: bytes) -> float:
    if not (text.isascii() and text.endswith(b"Z") and text[:-1].isdigit()):
        raise ValueError(f"bad certificate time {text!r}")
    digits = text[:-1].decode()
    if tag == UTC_TIME and len(digits) == 12:
        year = int(digits[:2])
        year, rest = year + (1900 if year >= 50 else 2000), digits[2:]
    elif tag == GENERALIZED_TIME and len(digits) == 14:
        year, rest = int(digits[:4]), digits[4:]
    else:
        raise ValueError(f"bad certificate time {text!r}")
    month, day, hour, minute, second = (int(rest[i:i + 2]) for i in range(0, 10, 2))
    if not (1 <= month <= 12 and 1 <= day <= 31 and hour < 24 and minute < 60 and second < 61):
        raise ValueError(f"bad certificate time {text!r}")
    return float(calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0)))


def validity_dates(der: bytes) -> tuple[float, float]:
    """(notBefore, notAfter) in seconds since the epoch."""
    tag, start, _ = _element(der, 0)
    if tag != SEQUENCE:
        raise ValueError("not a certificate (no outer SEQUENCE)")
    tag, at, end = _element(der, start)
    if tag != SEQUENCE:
        raise ValueError("not a certificate (no tbsCertificate)")
    fields: list[tuple[int, int, int]] = []
    while at < end and len(fields) < 5:
        tag, content, after = _element(der, at)
        if not (tag == CONTEXT_0 and not fields):  # the optional [0] version
            fields.append((tag, content, after))
        at = after
    if len(fields) < 4 or fields[3][0] != SEQUENCE:
        raise ValueError("not a certificate (no validity)")
    _, at, end = fields[3]
    times: list[float] = []
    for _ in range(2):
        tag, content, after = _element(der, at)
        times.append(_time(tag, der[content:after]))
        at = after
    return times[0], times[1]
