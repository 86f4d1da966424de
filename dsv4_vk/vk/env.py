"""Strict parsing of the `DSV4_VK_*` environment switches: a value that is not understood is a
ValueError naming the variable and what it accepts, never silently taken as "off"."""
import os
import re

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off", "")
_UNITS = {"": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
          "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30}
_BYTES = re.compile(r"^\s*(\d+)\s*([a-z]*)\s*$")


def flag(name: str, meaning: str = "enable") -> bool:
    """True for 1/true/yes/on, False when unset or 0/false/no/off/empty; ValueError otherwise."""
    raw = os.environ.get(name)
    if raw is None:
        return False
    v = raw.strip().lower()
    if v in TRUE:
        return True
    if v in FALSE:
        return False
    off = "keep enabled" if meaning == "disable" else "off"
    raise ValueError(f"environment variable {name}={raw!r} is not understood: expected 1/true/yes/on "
                     f"({meaning}) or 0/false/no/off/empty ({off})")


def byte_size(name: str, default: int) -> int:
    """A byte count: an integer with an optional unit K/M/G (KiB/MiB/GiB, powers of 1024); unset or
    empty gives `default`."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    m = _BYTES.match(raw.lower())
    if not m or m.group(2) not in _UNITS:
        raise ValueError(f"environment variable {name}={raw!r} is not understood: expected a byte count such "
                         "as 1073741824, 512M or 2GiB (units K, M, G, powers of 1024)")
    return int(m.group(1)) * _UNITS[m.group(2)]


def integer(name: str, default: int, lo: int, hi: int, what: str) -> int:
    """An integer in [lo, hi] (`what` says what it counts); unset or empty gives `default`."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    v = raw.strip()
    if not re.fullmatch(r"\d+", v) or not lo <= int(v) <= hi:
        raise ValueError(f"environment variable {name}={raw!r} is not understood: expected {what}, an integer "
                         f"from {lo} to {hi}")
    return int(v)
