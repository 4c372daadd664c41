"""dnnc: a deep-learning compiler in Python.

User API: `dnnc.compile`, `dnnc.load`, `dnnc.tune`, `dnnc.trace`, `dnnc.jit`,
`dnnc.export_onnx`, `dnnc.Graph`, `dnnc.errors`.
"""

from . import errors, log
from .compiler.driver import compile
from .compiler.module import CompiledModel, load
from .compiler.tune import tune
from .frontend.onnx_export import export_onnx
from .compiler.jit import jit
from .frontend.trace import trace
from .ir.graph import Graph
from .version import __version__

__all__ = ["compile", "load", "tune", "trace", "jit", "export_onnx", "CompiledModel", "Graph", "errors",
           "__version__"]
