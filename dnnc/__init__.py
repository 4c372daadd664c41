"""dnnc: a deep-learning compiler in Python.

User API: `dnnc.compile`, `dnnc.load`, `dnnc.tune`, `dnnc.trace`, `dnnc.jit`,
`dnnc.export_onnx`, `dnnc.Graph`, `dnnc.errors`.
"""

from . import errors, log
from .compiler.artifact import load
from .compiler.driver import compile
from .compiler.module import CompiledModel
from .compiler.tune import tune
from .frontend.onnx_export import export_onnx
from .compiler.jit import jit
from .frontend.trace import trace
from .ir.graph import Graph

__version__ = "0.1.0"
__all__ = ["compile", "load", "tune", "trace", "jit", "export_onnx", "CompiledModel", "Graph", "errors",
           "__version__"]
