"""Bytes of workgroup (shared) memory a SPIR-V compute module declares once its specialization
constants are set, so that a pipeline past the device's maxComputeSharedMemorySize is refused with
a clear error before it is made (a driver need not refuse it, and running it is undefined: the
device may be lost).

The count is of every Workgroup variable the module declares, used or not (the Vulkan limit is on
the declared total), sized without padding except 16 bytes for a 3-vector. Array lengths may be
specialization constants or integer expressions of them (OpSpecConstantOp); where the module uses
a form this reader does not evaluate, workgroup_bytes returns None (no check, never a false refusal).
"""
import struct
from collections.abc import Callable, Iterator

_OP_TYPE_BOOL, _OP_TYPE_INT, _OP_TYPE_FLOAT, _OP_TYPE_VECTOR, _OP_TYPE_MATRIX = 20, 21, 22, 23, 24
_OP_TYPE_ARRAY, _OP_TYPE_STRUCT, _OP_TYPE_POINTER = 28, 30, 32
_OP_CONSTANT_TRUE, _OP_CONSTANT_FALSE, _OP_CONSTANT = 41, 42, 43
_OP_SPEC_TRUE, _OP_SPEC_FALSE, _OP_SPEC, _OP_SPEC_OP = 48, 49, 50, 52
_OP_VARIABLE, _OP_DECORATE = 59, 71
_DECORATION_SPEC_ID = 1
_WORKGROUP = 4

_M = 0xFFFFFFFF


def _s(v: int) -> int:                      # a 32-bit word as a signed integer
    return v - (1 << 32) if v & 0x80000000 else v


# OpSpecConstantOp's integer and boolean operations (opcode: function of the operand values)
_SPEC_OPS: dict[int, Callable[..., int]] = {
    128: lambda a, b: (a + b) & _M,                         # IAdd
    130: lambda a, b: (a - b) & _M,                         # ISub
    132: lambda a, b: (a * b) & _M,                         # IMul
    134: lambda a, b: a // b,                               # UDiv
    137: lambda a, b: a % b,                                # UMod
    166: lambda a, b: int(bool(a) or bool(b)),              # LogicalOr
    167: lambda a, b: int(bool(a) and bool(b)),             # LogicalAnd
    168: lambda a: int(not a),                              # LogicalNot
    169: lambda c, a, b: a if c else b,                     # Select
    170: lambda a, b: int(a == b),                          # IEqual
    171: lambda a, b: int(a != b),                          # INotEqual
    172: lambda a, b: int(a > b),                           # UGreaterThan
    173: lambda a, b: int(_s(a) > _s(b)),                   # SGreaterThan
    174: lambda a, b: int(a >= b),                          # UGreaterThanEqual
    175: lambda a, b: int(_s(a) >= _s(b)),                  # SGreaterThanEqual
    176: lambda a, b: int(a < b),                           # ULessThan
    177: lambda a, b: int(_s(a) < _s(b)),                   # SLessThan
    178: lambda a, b: int(a <= b),                          # ULessThanEqual
    179: lambda a, b: int(_s(a) <= _s(b)),                  # SLessThanEqual
    194: lambda a, b: a >> b,                               # ShiftRightLogical
    196: lambda a, b: (a << b) & _M,                        # ShiftLeftLogical
    197: lambda a, b: a | b,                                # BitwiseOr
    198: lambda a, b: a ^ b,                                # BitwiseXor
    199: lambda a, b: a & b,                                # BitwiseAnd
}


def _instructions(code: bytes) -> Iterator[tuple[int, tuple[int, ...]]]:
    words = struct.unpack(f"<{len(code) // 4}I", code[:len(code) // 4 * 4])
    i = 5                                                   # past the header
    while i < len(words):
        count, op = words[i] >> 16, words[i] & 0xFFFF
        if count == 0:
            return
        yield op, words[i + 1:i + count]
        i += count


def workgroup_bytes(code: bytes, spec: dict[int, int]) -> int | None:
    """Bytes of the Workgroup variables of SPIR-V `code` with specialization constants `spec`
    (SpecId -> 32-bit value; the others at their defaults), or None where it cannot be evaluated."""
    spec_ids: dict[int, int] = {}
    values: dict[int, int] = {}                 # constants' values (booleans as 0 / 1)
    types: dict[int, int] = {}                  # types' sizes in bytes
    variables: list[int] = []                   # the Workgroup variables' pointer types
    for op, a in _instructions(code):
        if op == _OP_DECORATE and len(a) > 2 and a[1] == _DECORATION_SPEC_ID:
            spec_ids[a[0]] = a[2]
        elif op in (_OP_CONSTANT, _OP_SPEC):
            values[a[1]] = spec.get(spec_ids.get(a[1], -1), a[2]) if op == _OP_SPEC else a[2]
        elif op in (_OP_CONSTANT_TRUE, _OP_CONSTANT_FALSE, _OP_SPEC_TRUE, _OP_SPEC_FALSE):
            default = int(op in (_OP_CONSTANT_TRUE, _OP_SPEC_TRUE))
            values[a[1]] = int(bool(spec.get(spec_ids.get(a[1], -1), default))) if op >= _OP_SPEC_TRUE else default
        elif op == _OP_SPEC_OP:                 # (operations or operands it cannot evaluate: no value)
            args = [values[o] for o in a[3:] if o in values]
            if a[2] in _SPEC_OPS and len(args) == len(a) - 3:
                try:
                    values[a[1]] = _SPEC_OPS[a[2]](*args)
                except (TypeError, ZeroDivisionError):
                    pass
        elif op == _OP_TYPE_BOOL:
            types[a[0]] = 4
        elif op in (_OP_TYPE_INT, _OP_TYPE_FLOAT):
            types[a[0]] = a[1] // 8
        elif op == _OP_TYPE_VECTOR and a[1] in types:
            types[a[0]] = types[a[1]] * (4 if a[2] == 3 else a[2])
        elif op == _OP_TYPE_MATRIX and a[1] in types:
            types[a[0]] = types[a[1]] * a[2]
        elif op == _OP_TYPE_ARRAY and a[1] in types and a[2] in values:
            types[a[0]] = types[a[1]] * values[a[2]]
        elif op == _OP_TYPE_STRUCT and all(m in types for m in a[1:]):
            types[a[0]] = sum(types[m] for m in a[1:])
        elif op == _OP_TYPE_POINTER and a[1] == _WORKGROUP and a[2] in types:
            types[a[0]] = types[a[2]]
        elif op == _OP_VARIABLE and a[2] == _WORKGROUP:
            variables.append(a[0])
    if any(t not in types for t in variables):
        return None
    return sum(types[t] for t in variables)
