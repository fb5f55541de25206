"""The extender reads its certificate's validity without a crypto library: compared with what the `cryptography`
package (a test dependency) and openssl-style fixed dates say, and never anything but ValueError on garbage."""

from __future__ import annotations

import contextlib
import datetime

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from hypothesis import given
from hypothesis import strategies as st

from neuron_dra.extender.certdates import first_pem_der, validity_dates

UTC = datetime.UTC


def pem(not_before: datetime.datetime, not_after: datetime.datetime) -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "neuron-scheduler-extender")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(not_before).not_valid_after(not_after)
            .sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM)


@pytest.mark.parametrize(("before", "after"), [
    # UTCTime (RFC 5280: dates through 2049)
    (datetime.datetime(2026, 12, 6, 6, 18, 34, tzinfo=UTC), datetime.datetime(2027, 3, 6, 0, 0, 1, tzinfo=UTC)),
    # GeneralizedTime (RFC 5280: dates in 2050 or later), and a UTCTime year of the 1900s
    (datetime.datetime(1999, 1, 1, tzinfo=UTC), datetime.datetime(2051, 2, 28, 23, 59, 59, tzinfo=UTC)),
])
def test_dates_match_the_certificate(before: datetime.datetime, after: datetime.datetime) -> None:
    data = pem(before, after) + b"\n" + pem(after, after)  # a chain: the first block counts
    assert validity_dates(first_pem_der(data)) == (before.timestamp(), after.timestamp())


@given(st.binary(max_size=300))
def test_garbage_is_a_value_error(data: bytes) -> None:
    for blob in (data, b"-----BEGIN CERTIFICATE-----\n" + data + b"\n-----END CERTIFICATE-----\n"):
        with contextlib.suppress(ValueError):
            validity_dates(first_pem_der(blob))


@given(st.binary(max_size=300))
def test_any_der_is_a_value_error_or_dates(der: bytes) -> None:
    with contextlib.suppress(ValueError):
        validity_dates(der)
