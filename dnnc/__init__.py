"""dnnc: a deep-learning compiler in Python.

User API: `dnnc.compile`, `dnnc.Graph`, `dnnc.errors` (more to come: load, trace, jit, tune).
"""

from . import errors
from .compiler.driver import compile
from .compiler.module import CompiledModel
from .ir.graph import Graph

__version__ = "0.1.0"
__all__ = ["compile", "CompiledModel", "Graph", "errors", "__version__"]
