"""Op declarations. Importing this package registers every op in `REGISTRY`."""
from . import elementwise  # noqa: F401
from . import rows, concat, matmul, get_rows  # noqa: F401
from . import hc  # noqa: F401
from . import model_ops  # noqa: F401
from .base import REGISTRY, Launch, OpDef, get_op, register

__all__ = ["REGISTRY", "Launch", "OpDef", "get_op", "register"]
