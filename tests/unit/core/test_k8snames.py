"""The Kubernetes name rules against the rules as Kubernetes documents them, written here independently (plain
string operations, no regular expressions): every name accepted satisfies them, every name that satisfies them is
accepted, and newline, NUL and non-ASCII variants of good names are refused everywhere a name enters."""

from __future__ import annotations

import argparse
import string

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from accel_core import cli
from accel_core.dra.claims import check_claim_ref
from accel_core.dra.slicemodel import SliceDevice, SliceValidationError, Taint, Version, validate_device
from accel_core.dra.types import ClaimError, ClaimRef
from accel_core.k8snames import is_c_identifier, is_label, is_name_part, is_subdomain, is_uid

LOWER_ALNUM = set(string.ascii_lowercase + string.digits)


def rule_label(text: str) -> bool:
    """RFC 1123 label as Kubernetes documents it: at most 63 characters, lower-case alphanumerics or '-', starting
    and ending with an alphanumeric."""
    return (1 <= len(text) <= 63 and all(c in LOWER_ALNUM or c == "-" for c in text)
            and text[0] in LOWER_ALNUM and text[-1] in LOWER_ALNUM)


def rule_subdomain(text: str) -> bool:
    """RFC 1123 subdomain: at most 253 characters, lower-case alphanumerics, '-' or '.', starting and ending with an
    alphanumeric; each dot-separated part starts and ends with an alphanumeric."""
    if not 1 <= len(text) <= 253:
        return False
    parts = text.split(".")
    return all(p and all(c in LOWER_ALNUM or c == "-" for c in p) and p[0] in LOWER_ALNUM and p[-1] in LOWER_ALNUM
               for p in parts)


def rule_c_identifier(text: str) -> bool:
    """A C identifier of at most 32 characters (ResourceSlice attribute names)."""
    ident_start = set(string.ascii_letters + "_")
    return 1 <= len(text) <= 32 and text[0] in ident_start and all(c in ident_start | set(string.digits)
                                                                    for c in text)


#: Characters near every rule's edges: ASCII letters of both cases, digits, the separators, whitespace, NUL, and
#: look-alikes from other scripts (full-width, dotless i, Arabic-Indic digit, Kelvin sign).
NEAR = "abcz09AZ-._/ \n\r\t\x00\u0131\uff41\u0661\u212a\u00e9"
names = st.text(alphabet=NEAR, max_size=70) | st.from_regex(r"[a-z0-9]([-a-z0-9.]{0,70}[a-z0-9])?", fullmatch=True)


@given(names)
@example("abc\n")
@example("a" * 63)
@example("a" * 64)
def test_labels_are_exactly_the_documented_rule(text: str) -> None:
    assert is_label(text) == rule_label(text), text


@given(names | st.lists(st.from_regex(r"[a-z0-9]{1,63}", fullmatch=True), min_size=1, max_size=6).map(".".join))
@example("abc.def\n")
@example(".".join(["a" * 63] * 4))  # 255 characters
@example(".".join(["a" * 63] * 3) + "." + "a" * 61)  # 253 characters
def test_subdomains_are_exactly_the_documented_rule(text: str) -> None:
    assert is_subdomain(text) == rule_subdomain(text), text


@given(st.text(alphabet=NEAR + "_", max_size=40))
@example("pcieRoot\n")
@example("_" * 32)
@example("a" * 33)
def test_c_identifiers_are_exactly_the_documented_rule(text: str) -> None:
    assert is_c_identifier(text) == rule_c_identifier(text), text


good_label = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True)
bad_tail = st.sampled_from(["\n", "\x00", "\r\n", "\u0131", "\uff41", "\u0661", "\u212a", " "])


@given(good_label, bad_tail, st.booleans())
def test_control_and_unicode_variants_are_refused_everywhere_a_name_enters(name: str, bad: str, front: bool) -> None:
    variant = bad + name if front else name + bad
    assert is_label(name) and is_subdomain(name) and is_uid(name) and is_name_part(name)
    assert not (is_label(variant) or is_subdomain(variant) or is_uid(variant) or is_name_part(variant))
    with pytest.raises(SliceValidationError):
        validate_device(SliceDevice(variant))
    with pytest.raises(SliceValidationError):
        validate_device(SliceDevice("dev", attributes={variant: 1}))
    with pytest.raises(SliceValidationError):
        validate_device(SliceDevice("dev", taints=(Taint(f"example.com/{variant}"),)))
    for ref in (ClaimRef(variant, "u-1", "c"), ClaimRef("ns", "u-1", variant), ClaimRef("ns", variant, "c")):
        with pytest.raises(ClaimError):
            check_claim_ref(ref)
    for parse in (cli.node_name, cli.uid):
        with pytest.raises(argparse.ArgumentTypeError):
            parse(variant)


def test_a_device_name_with_a_trailing_newline_is_refused() -> None:
    """``^...$`` with ``match`` accepted ``"abc\\n"`` as a DNS label."""
    with pytest.raises(SliceValidationError, match="DNS label"):
        validate_device(SliceDevice("abc\n"))
    with pytest.raises(SliceValidationError, match="C identifier"):
        validate_device(SliceDevice("abc", attributes={"model\n": "x"}))


@pytest.mark.parametrize("uid", ["0b6c2d1e-8f4a-4c3b-9e7d-5a1f2b3c4d5e", "d41d8cd98f00b204e9800998ecf8427e",
                                 "u" * 100, "u" * 128])
def test_a_pod_uid_and_a_claim_uid_follow_the_same_rule(uid: str) -> None:
    """A UUID (the API server's), an md5 hex (a static pod's) and long UIDs: accepted as claim UIDs and as POD_UID
    alike; one character more than the limit is refused by both."""
    assert cli.uid(uid) == uid
    check_claim_ref(ClaimRef("ns", uid, "c"))
    too_long = uid + "x" * (129 - len(uid))
    with pytest.raises(argparse.ArgumentTypeError):
        cli.uid(too_long)
    with pytest.raises(ClaimError):
        check_claim_ref(ClaimRef("ns", too_long, "c"))


@pytest.mark.parametrize("text", ["\u0661\u0662", "\uff11Gi", "1.0.\u0661"])
def test_digits_of_other_scripts_are_no_quantity_or_version(text: str) -> None:
    """Kubernetes quantities and semantic versions are ASCII digits; ``\\d`` and Decimal also take other scripts'."""
    with pytest.raises(SliceValidationError):
        validate_device(SliceDevice("dev", capacity={"memory": text}))
    with pytest.raises(SliceValidationError, match="semantic version"):
        validate_device(SliceDevice("dev", attributes={"driverVersion": Version(text)}))
