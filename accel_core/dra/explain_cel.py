"""DRA device selectors (CEL) for ``explain``, evaluated by a CEL library (``common-expression-language``, the
Rust cel interpreter), in the environment Kubernetes 1.37 gives them:

- ``device.driver``, ``device.allowMultipleAllocations``, ``device.attributes[domain][name]`` and
  ``device.capacity[domain][name]``; an unqualified attribute or capacity name is in the driver's domain, and a
  domain the device does not have reads as an empty map (for domains named by a string literal, which is how
  selectors name them);
- version attributes and ``semver(s)``, ``semver(s, true)``, ``isSemver(s)`` with ``compareTo``,
  ``isGreaterThan``, ``isLessThan``, ``major``, ``minor``, ``patch``;
- capacities and ``quantity(s)``, ``isQuantity(s)`` with ``compareTo``, ``isGreaterThan``, ``isLessThan``,
  ``asInteger``, ``asApproximateFloat``;
- CEL's standard macros and functions (``has``, ``in``, ``exists``, ``all``, ``size``, ``startsWith``,
  ``endsWith``, ``contains``, ``matches``, conversions);
- from the strings library: ``lowerAscii``, ``upperAscii``, ``trim``, ``replace``, ``split``, ``join``,
  ``substring``, ``charAt``, ``indexOf``, ``lastIndexOf``.

Anything else Kubernetes offers (``cel.bind``, the rest of the strings library, the lists, sets, IP, URL, regex and
format libraries) is refused when the selector is compiled, naming the function, so ``explain`` says it cannot
judge that selector rather than guess. A missing attribute is a runtime error, as in the scheduler (which then
stops allocating the claim).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

SEMVER_KEY = "__semver__"
QUANTITY_KEY = "__quantity__"
INSTALL_HINT = "pip install 'aws-accel-agents[explain]'"

#: What the CEL library evaluates itself: macros, operators, the standard functions.
_BUILTIN = frozenset({
    "has", "size", "contains", "startsWith", "endsWith", "matches", "exists", "all", "exists_one", "map", "filter",
    "int", "uint", "double", "string", "bytes", "bool", "dyn", "type", "timestamp", "duration",
})


class CelUnsupported(ValueError):
    """The selector uses something explain's CEL environment does not provide (the scheduler may)."""


class CelRuntimeError(ValueError):
    """The selector failed on a device (the scheduler fails the claim's allocation on the same error)."""


# -- semver and quantity values ------------------------------------------------------------------------------------
_SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
                     r"(?:-((?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*)(?:\.(?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*))*))?"
                     r"(?:\+([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?$")
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E))?$")
_SUFFIX = {name: Fraction(value) for name, value in (
    ("Ki", 2**10), ("Mi", 2**20), ("Gi", 2**30), ("Ti", 2**40), ("Pi", 2**50), ("Ei", 2**60),
    ("n", Fraction(1, 10**9)), ("u", Fraction(1, 10**6)), ("m", Fraction(1, 1000)),
    ("k", 10**3), ("M", 10**6), ("G", 10**9), ("T", 10**12), ("P", 10**15), ("E", 10**18))}


def semver_value(text: str, normalize: bool = False) -> dict[str, str]:
    """A version as the selector sees it: a one-key map, so that ``==`` compares versions."""
    if normalize:  # as Kubernetes' semver(s, true): "v" prefix, missing minor/patch, leading zeros
        m = re.match(r"^v?(\d+)(?:\.(\d+))?(?:\.(\d+))?(.*)$", text)
        if m:
            text = f"{int(m[1])}.{int(m[2] or 0)}.{int(m[3] or 0)}{m[4]}"
    if not _SEMVER.match(text):
        raise ValueError(f"not a semantic version: {text!r}")
    return {SEMVER_KEY: text}


def _semver_parts(value: Any) -> tuple[tuple[int, int, int], list[str]]:
    if not isinstance(value, dict) or SEMVER_KEY not in value:
        raise ValueError(f"expected a version, got {value!r}")
    m = _SEMVER.match(value[SEMVER_KEY])
    assert m is not None
    return (int(m[1]), int(m[2]), int(m[3])), (m[4].split(".") if m[4] else [])


def _semver_cmp(a: Any, b: Any) -> int:
    (core_a, pre_a), (core_b, pre_b) = _semver_parts(a), _semver_parts(b)
    if core_a != core_b:
        return -1 if core_a < core_b else 1
    if not pre_a or not pre_b:  # a release ranks above its pre-releases
        return (len(pre_b) > 0) - (len(pre_a) > 0)
    for x, y in zip(pre_a, pre_b, strict=False):
        if x == y:
            continue
        if x.isdigit() and y.isdigit():
            return -1 if int(x) < int(y) else 1
        if x.isdigit() != y.isdigit():
            return -1 if x.isdigit() else 1
        return -1 if x < y else 1
    return (len(pre_a) > len(pre_b)) - (len(pre_a) < len(pre_b))


def parse_quantity(text: str) -> Fraction:
    """A Kubernetes quantity (``16Gi``, ``1.5``, ``100m``, ``1e3``) as an exact number."""
    m = _QUANTITY.match(text.strip())
    if not m:
        raise ValueError(f"not a quantity: {text!r}")
    number = Fraction(m[1])
    if m[2]:
        number *= Fraction(10) ** int(m[2][1:])
    elif m[3]:
        number *= _SUFFIX[m[3]]
    return number


def quantity_value(text: str) -> dict[str, str]:
    """A quantity as the selector sees it: a one-key map holding the exact number, so ``==`` compares values."""
    return {QUANTITY_KEY: str(parse_quantity(text))}


def _number(value: Any) -> Fraction:
    if not isinstance(value, dict) or QUANTITY_KEY not in value:
        raise ValueError(f"expected a quantity, got {value!r}")
    return Fraction(value[QUANTITY_KEY])


def _compare(a: Any, b: Any) -> int:
    if isinstance(a, dict) and SEMVER_KEY in a:
        return _semver_cmp(a, b)
    x, y = _number(a), _number(b)
    return (x > y) - (x < y)


def _valid(parse: Callable[[str], object]) -> Callable[[str], bool]:
    def check(text: str) -> bool:
        try:
            parse(text)
        except ValueError:
            return False
        return True
    return check


_LOWER = {c: c + 32 for c in range(ord("A"), ord("Z") + 1)}
_UPPER = {v: k for k, v in _LOWER.items()}


def _split(text: str, separator: str, limit: int = -1) -> list[str]:
    """CEL strings ``split``: a limit of 0 gives nothing, n > 0 at most n parts, negative all."""
    if limit == 0:
        return []
    return text.split(separator, limit - 1) if limit > 0 else text.split(separator)


FUNCTIONS: Mapping[str, Callable[..., Any]] = {
    # Kubernetes' strings library (cel-go ext.Strings), the parts selectors use
    "lowerAscii": lambda s: s.translate(_LOWER),
    "upperAscii": lambda s: s.translate(_UPPER),
    "trim": lambda s: s.strip(" \t\n\r\v\f"),
    "replace": lambda s, old, new, n=-1: s.replace(old, new, n),
    "split": _split,
    "join": lambda items, sep="": sep.join(items),
    "substring": lambda s, start, end=None: s[start:end],
    "charAt": lambda s, i: s[i:i + 1],
    "indexOf": lambda s, sub, *start: s.find(sub, *start),
    "lastIndexOf": lambda s, sub: s.rfind(sub),
    # Kubernetes' semver and quantity libraries
    "semver": semver_value,
    "isSemver": _valid(semver_value),
    "quantity": quantity_value,
    "isQuantity": _valid(parse_quantity),
    "compareTo": _compare,
    "isGreaterThan": lambda a, b: _compare(a, b) > 0,
    "isLessThan": lambda a, b: _compare(a, b) < 0,
    "major": lambda v: _semver_parts(v)[0][0],
    "minor": lambda v: _semver_parts(v)[0][1],
    "patch": lambda v: _semver_parts(v)[0][2],
    "asInteger": lambda q: int(_number(q)),
    "asApproximateFloat": lambda q: float(_number(q)),
}


# -- devices as the selector sees them -----------------------------------------------------------------------------
def attribute_value(attr: Mapping[str, Any]) -> Any:
    """One ResourceSlice attribute (``{"int": 3}``, ``{"version": "1.2.3"}``...) as CEL sees it."""
    for kind in ("int", "bool", "string"):
        if kind in attr:
            return attr[kind]
    if "version" in attr:
        return semver_value(attr["version"])
    for kind in ("ints", "bools", "strings"):
        if kind in attr:
            return list(attr[kind])
    if "versions" in attr:
        return [semver_value(v) for v in attr["versions"]]
    raise ValueError(f"unsupported attribute value {dict(attr)!r}")


def split_name(name: str, driver: str) -> tuple[str, str]:
    """``domain/id`` or, unqualified, the driver's domain."""
    domain, sep, ident = name.partition("/")
    return (domain, ident) if sep else (driver, name)


def device_variable(driver: str, device: Mapping[str, Any]) -> dict[str, Any]:
    """``device`` for one ResourceSlice device of ``driver``."""
    attributes: dict[str, dict[str, Any]] = {}
    for name, attr in (device.get("attributes") or {}).items():
        domain, ident = split_name(name, driver)
        attributes.setdefault(domain, {})[ident] = attribute_value(attr)
    capacity: dict[str, dict[str, Any]] = {}
    for name, cap in (device.get("capacity") or {}).items():
        domain, ident = split_name(name, driver)
        capacity.setdefault(domain, {})[ident] = quantity_value(str(cap.get("value", "0")))
    return {"driver": driver, "allowMultipleAllocations": bool(device.get("allowMultipleAllocations", False)),
            "attributes": attributes, "capacity": capacity}


_LITERAL = re.compile(r"'((?:[^'\\]|\\.)*)'|\"((?:[^\"\\]|\\.)*)\"")


def device_context(device: Mapping[str, Any], domains: Iterable[str]) -> Any:
    """The evaluation context for one device (from :func:`device_variable`), shared by its selectors; ``domains``
    (every string literal of those selectors) read as empty maps where the device lacks them, as in Kubernetes."""
    variable = {**device, "attributes": dict(device["attributes"]), "capacity": dict(device["capacity"])}
    for domain in domains:
        variable["attributes"].setdefault(domain, {})
        variable["capacity"].setdefault(domain, {})
    return _library().Context(variables={"device": variable}, functions=dict(FUNCTIONS))


@dataclass(frozen=True)
class Selector:
    """One compiled ``cel.expression``."""

    expression: str
    _program: Any
    literals: tuple[str, ...]

    def matches(self, device: Mapping[str, Any], context: Any = None) -> bool:
        """Whether ``device`` (from :func:`device_variable`) passes; CelRuntimeError as the scheduler would fail.
        ``context``: from :func:`device_context` with at least this selector's literals (else made here)."""
        try:
            result = self._program.execute(context or device_context(device, self.literals))
        except KeyError as exc:
            raise CelRuntimeError(f"no such key: {exc.args[0] if exc.args else exc}") from None
        except (RuntimeError, ValueError, TypeError) as exc:
            raise CelRuntimeError(str(exc).split(". Check ")[0]) from None
        if not isinstance(result, bool):
            raise CelRuntimeError(f"the selector gave {type(result).__name__} {result!r}, not a bool")
        return result


def _library() -> Any:
    """The CEL library, imported on first use (an optional dependency that only explain needs; ~0.2 s)."""
    return importlib.import_module("cel")


def available() -> bool:
    try:
        _library()
    except ImportError:
        return False
    return True


def compile_selector(expression: str) -> Selector:
    """Compile one selector; CelUnsupported naming what explain cannot evaluate (or a syntax error)."""
    try:
        library = _library()
    except ImportError:
        raise CelUnsupported(f"no CEL library: {INSTALL_HINT}") from None
    try:
        program = library.compile(expression)
    except (ValueError, RuntimeError) as exc:
        raise CelUnsupported(f"does not compile: {str(exc).splitlines()[0]}") from None
    refs = program.references()
    functions = {f for f in refs.get("functions", []) if f[:1].isalpha()}  # not operators
    if "bind" in functions:
        raise CelUnsupported("cel.bind is not supported by explain's CEL library (the scheduler supports it)")
    unknown = sorted(functions - _BUILTIN - set(FUNCTIONS))
    if unknown:
        raise CelUnsupported(f"{', '.join(unknown)}: not in explain's CEL environment (see accel_core/dra/"
                             "explain_cel.py for what is)")
    variables = set(refs.get("variables", [])) - {"device"}
    if variables:  # comprehension variables are listed too; they are fine when bound by a macro
        macros = {"exists", "all", "exists_one", "map", "filter"} & set(refs.get("functions", []))
        if not macros:
            raise CelUnsupported(f"unknown variable {', '.join(sorted(variables))} (only 'device' is defined)")
    literals = tuple(dict.fromkeys(a or b for a, b in _LITERAL.findall(expression) if a or b))
    return Selector(expression, program, literals)
