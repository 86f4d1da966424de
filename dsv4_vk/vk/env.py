"""Strict parsing of the `DSV4_VK_*` environment switches: a value that is not understood is a
ValueError naming the variable and what it accepts, never silently taken as "off". A `DSV4_VK_*`
variable the package does not read (a typo) is reported by a RuntimeWarning naming it and the
known ones, once per process, when a device opens (`report_unknown`)."""
import difflib
import os
import re
import warnings

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off", "")
_UNITS = {"": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
          "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30}
_BYTES = re.compile(r"^\s*([0-9]{1,30})\s*([a-z]*)\s*$")     # ASCII digits only: int() would take "²" too
KNOWN = ("DSV4_VK_DEVICE", "DSV4_VK_CACHE_DIR", "DSV4_VK_GLSLANG", "DSV4_VK_VALIDATION", "DSV4_VK_CACHE_BYTES",
         "DSV4_VK_SPIN_US", "DSV4_VK_DISABLE_HC", "DSV4_VK_DISABLE_HC_COMB", "DSV4_VK_DISABLE_HC_PRE",
         "DSV4_VK_DISABLE_HC_POST", "DSV4_VK_DISABLE_HC_SITE", "DSV4_VK_HC_COMB_VARIANT", "DSV4_VK_PROFILE",
         "DSV4_VK_DISABLE_COOPMAT", "DSV4_VK_FORCE_STAGING")
_reported: set = set()


def report_unknown() -> None:
    """A RuntimeWarning for each `DSV4_VK_*` variable set that the package does not read (once per
    name and process): a misspelt switch would otherwise change nothing without a word."""
    for name in sorted(os.environ):
        if name.startswith("DSV4_VK_") and name not in KNOWN and name not in _reported:
            _reported.add(name)
            close = difflib.get_close_matches(name, KNOWN, 1, 0.85)
            hint = f" (did you mean {close[0]}?)" if close else ""
            warnings.warn(f"environment variable {name} is not a dsv4_vk switch{hint}, so it changes nothing; "
                          f"the switches are {', '.join(KNOWN)}", RuntimeWarning, stacklevel=3)


def _shown(raw: str) -> str:
    return repr(raw) if len(raw) <= 60 else f"{raw[:60]!r}... ({len(raw)} characters)"


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
    raise ValueError(f"environment variable {name}={_shown(raw)} is not understood: expected 1/true/yes/on "
                     f"({meaning}) or 0/false/no/off/empty ({off})")


def byte_size(name: str, default: int) -> int:
    """A byte count: an integer with an optional unit K/M/G (KiB/MiB/GiB, powers of 1024); unset or
    empty gives `default`."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    m = _BYTES.match(raw.lower())
    if not m or m.group(2) not in _UNITS:
        raise ValueError(f"environment variable {name}={_shown(raw)} is not understood: expected a byte count such "
                         "as 1073741824, 512M or 2GiB (units K, M, G, powers of 1024)")
    return int(m.group(1)) * _UNITS[m.group(2)]


def integer(name: str, default: int, lo: int, hi: int, what: str) -> int:
    """An integer in [lo, hi] (`what` says what it counts); unset or empty gives `default`."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    v = raw.strip()
    if not re.fullmatch(r"[0-9]{1,30}", v) or not lo <= int(v) <= hi:
        raise ValueError(f"environment variable {name}={_shown(raw)} is not understood: expected {what}, an integer "
                         f"from {lo} to {hi}")
    return int(v)
