"""Push constants: a shader's own `layout(push_constant)` block, read from its source, and the packer.

A launch gives its push block as {field: value}; `pack_fields` lays the values out in the order the
shader declares them (the members that the launch's defines select: `#if defined(X)` inside or
around the block), and refuses a missing, unknown or extra field, an array of the wrong length, a
non-integer for a `uint`/`int` or a non-number for a `float`, naming the shader and the field. The
order is thus written once, in the shader. Every member is 4 bytes (uint, int, float, or arrays of
them), so the block has no padding.
"""
from __future__ import annotations

import functools
import re
import struct
from typing import Any, Mapping, NamedTuple

import numpy as np

from .errors import ShaderCompileError
from .shader import shader_source, variant_key

PUSH_SIZE = 128
_BLOCK = re.compile(r"layout\s*\(\s*push_constant\s*\)\s*uniform\s+\w+\s*\{(.*?)\}\s*\w*\s*;", re.S)
_MEMBER = re.compile(r"^\s*(uint|int|float)\s+([^;]+);\s*$")
_NAME = re.compile(r"^([A-Za-z_]\w*)(?:\s*\[\s*(\d+)\s*\])?$")
_DIRECTIVE = re.compile(r"^\s*#\s*(if|ifdef|ifndef|elif|else|endif)\b(.*)$")


class PushField(NamedTuple):
    name: str
    type: str       # "uint", "int" or "float"
    length: int     # 1, or the array's length


def _condition(expr: str, defines: Mapping[str, str], where: str) -> bool:
    """A preprocessor condition of `defined(X)`, `||`, `&&`, `!`, integers and comparisons."""
    expr = re.sub(r"//.*|/\*.*?\*/", "", expr)
    expr = re.sub(r"defined\s*\(\s*(\w+)\s*\)|defined\s+(\w+)",
                  lambda m: "1" if (m.group(1) or m.group(2)) in defines else "0", expr)
    expr = re.sub(r"[A-Za-z_]\w*", lambda m: str(defines.get(m.group(0), "0")), expr)
    expr = expr.replace("&&", " and ").replace("||", " or ")
    expr = re.sub(r"!(?!=)", " not ", expr)
    if not re.fullmatch(r"[\d\s()<>=!andotr]*", expr):
        raise ShaderCompileError(f"{where}: cannot evaluate the condition {expr.strip()!r} around its push block")
    return bool(eval(expr, {"__builtins__": {}}))      # digits, operators and and/or/not only (checked)


def _active_text(text: str, defines: Mapping[str, str], where: str) -> str:
    """The lines of `text` that the preprocessor keeps under `defines` (directives dropped)."""
    out, stack = [], []         # stack: (this branch taken, some branch of this #if taken, parent active)
    active = True
    for line in text.splitlines():
        m = _DIRECTIVE.match(line)
        if not m:
            if active:
                out.append(line)
            continue
        kind, rest = m.group(1), m.group(2)
        if kind in ("if", "ifdef", "ifndef"):
            cond = _condition(rest if kind == "if" else f"defined({rest.strip()})", defines, where)
            cond = not cond if kind == "ifndef" else cond
            stack.append((active, cond))
            active = active and cond
        elif kind == "elif":
            parent, taken = stack[-1]
            cond = not taken and _condition(rest, defines, where)
            stack[-1] = (parent, taken or cond)
            active = parent and cond
        elif kind == "else":
            parent, taken = stack[-1]
            stack[-1] = (parent, True)
            active = parent and not taken
        else:
            parent, _ = stack.pop()
            active = parent
    return "\n".join(out)


@functools.lru_cache(maxsize=None)
def _push_block(name: str, key: tuple) -> tuple[PushField, ...]:
    where = f"{name}.comp"
    defines = dict(key)
    blocks = _BLOCK.findall(_active_text(shader_source(name), defines, where))
    if len(blocks) != 1:
        raise ShaderCompileError(f"{where}: expected one layout(push_constant) block under the defines {defines}, "
                                 f"found {len(blocks)}")
    fields = []
    for member in re.sub(r"//[^\n]*|/\*.*?\*/", "", blocks[0], flags=re.S).split(";"):
        if not member.strip():
            continue
        m = _MEMBER.match(member + ";")
        if not m:
            raise ShaderCompileError(f"{where}: push block member {member.strip()!r} is not uint/int/float")
        for part in m.group(2).split(","):
            n = _NAME.match(part.strip())
            if not n:
                raise ShaderCompileError(f"{where}: bad push block member name {part.strip()!r}")
            fields.append(PushField(n.group(1), m.group(1), int(n.group(2) or 1)))
    return tuple(fields)


def push_block(name: str, defines: Mapping[str, Any] | None = None) -> tuple[PushField, ...]:
    """The members of shader `name`'s push block under `defines`, in order."""
    return _push_block(name, variant_key(dict(defines or {})))


def _word(v: Any, type_: str, what: str) -> bytes:
    if type_ == "float":
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise ValueError(f"{what} is a float: expected a number, got {type(v).__name__} {v!r}")
        return struct.pack("<f", float(v))
    if isinstance(v, (float, np.floating)) or not isinstance(v, (int, np.integer)):
        raise ValueError(f"{what} is a {type_}: expected an integer, got {type(v).__name__} {v!r}")
    i = int(v)
    lo, hi = (0, 2**32) if type_ == "uint" else (-2**31, 2**31)
    if not lo <= i < hi:
        raise ValueError(f"{what} is a {type_}: {i} is out of its range [{lo}, {hi})")
    return struct.pack("<I" if type_ == "uint" else "<i", i)


def pack_fields(shader: str, defines: Mapping[str, Any] | None, values: Mapping[str, Any]) -> bytes:
    """The push block of `shader` (under `defines`) from {field: value}: every field of the block,
    no other; arrays as sequences of their length."""
    fields = push_block(shader, defines)
    names = [f.name for f in fields]
    missing = [n for n in names if n not in values]
    extra = [n for n in values if n not in names]
    if missing or extra:
        raise ValueError(f"push block of {shader}.comp: " + "; ".join(
            ([f"missing field(s) {', '.join(missing)}"] if missing else []) +
            ([f"unknown field(s) {', '.join(map(str, extra))}"] if extra else [])) +
            f" (the block, under {dict(defines or {})}: {', '.join(names)})")
    words = []
    for f in fields:
        v, what = values[f.name], f"push field {f.name} of {shader}.comp"
        if f.length == 1:
            words.append(_word(v, f.type, what))
            continue
        if not isinstance(v, (list, tuple, np.ndarray)) or len(v) != f.length:
            raise ValueError(f"{what} is {f.type}[{f.length}]: expected {f.length} values, got {v!r}")
        words += [_word(x, f.type, f"{what}[{i}]") for i, x in enumerate(v)]
    data = b"".join(words)
    if len(data) > PUSH_SIZE:
        raise ValueError(f"push block of {shader}.comp: {len(data)} bytes exceed {PUSH_SIZE}")
    return data


def pack_push(*fields: Any) -> bytes:
    """Positional packing, for blocks not given by name (the device floor's probes): numbers or
    sequences of numbers, flattened in order, become 4-byte words: floats as float32, integers as
    uint32 (int32 when negative)."""
    words = []

    def add(v):
        if isinstance(v, (list, tuple)):
            for x in v:
                add(x)
        elif isinstance(v, (float, np.floating)):
            words.append(struct.pack("<f", float(v)))
        elif isinstance(v, (bool, int, np.integer)):
            i = int(v)
            if not -2**31 <= i < 2**32:
                raise ValueError(f"push constant {i} does not fit in 32 bits")
            words.append(struct.pack("<i" if i < 0 else "<I", i))
        else:
            raise ValueError(f"push constant must be a number, got {type(v).__name__} {v!r}")
    add(list(fields))
    data = b"".join(words)
    if len(data) > PUSH_SIZE:
        raise ValueError(f"push constants of {len(data)} bytes exceed {PUSH_SIZE}")
    return data
