"""dnnc: a deep-learning compiler in Python.

User API: `dnnc.compile`, `dnnc.load`, `dnnc.Graph`, `dnnc.errors` (more to come: trace, jit,
tune).
"""

from . import errors
from .compiler.artifact import load
from .compiler.driver import compile
from .compiler.module import CompiledModel
from .ir.graph import Graph

__version__ = "0.1.0"
__all__ = ["compile", "load", "CompiledModel", "Graph", "errors", "__version__"]
