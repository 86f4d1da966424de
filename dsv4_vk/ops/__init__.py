"""Primitive and model op families, one module each. Importing this package registers every op."""
from . import elementwise, reduce_rows, concat, mul_mat, get_rows  # noqa: F401
from . import attention, moe, sample, step, rope, v4_attention, v4_gate, compress  # noqa: F401
from .base import REGISTRY, Launch, OpDef, get_op, register

__all__ = ["REGISTRY", "Launch", "OpDef", "get_op", "register"]
