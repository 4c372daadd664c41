"""The op registry and its op families; see `registry.py` for what an op holds."""

from .registry import REQUIRED, OpDef, Pattern, all_ops, get_op, is_registered, register_op

__all__ = ["REQUIRED", "OpDef", "Pattern", "all_ops", "get_op", "is_registered", "register_op"]
