"""expand_powers: Pow by the constant 2 or 3 as multiplies (x*x, x*x*x), late in the pipeline.

A float Pow compiles to a vector `pow` call, tens of instructions an element; x*x is one
multiply. Exporters write the squares and cubes of a decomposed LayerNorm and of the tanh
Gelu as Pow; `simplify` recognises those patterns, but one the quantizer splits with
Quantize/DequantizeLinear pairs stays a Pow (onnxruntime's quantize_static in operator
format leaves gpt2's Gelu so: its Pow(x, 3) was the gpt2 int8 file's largest cost at 1
thread). The pass runs after every pass that matches Pow (simplify's patterns, store_half's
float32 squares), so it never hides one from them.

What each rewrite gives, element by element, for float32 and float64 x:

- Pow(x, 2) == x*x exactly: both are x**2 rounded once (NaN, inf and -0 alike); NumPy's x**2
  and onnxruntime's Pow(x, 2) compute x*x too;
- Pow(x, 3) == (x*x)*x, which is what onnxruntime's Pow(x, 3) computes (bit-identical on
  random inputs); it rounds twice, so it may differ from a correctly rounded pow (NumPy's
  np.power(x, 3.0)) in the last place: within 1.5 ulp of x**3 (signs, NaN and inf as pow's).

Other exponents stay Pow: x**0.5 is not Sqrt(x) at -0 and -inf (pow gives +0 and +inf),
1/x is not pow(x, -1) in the last place, and a fourth power rounds three times.
Only float32 and float64 Pow are rewritten (a half-typed multiply rounds each product to the
half type, a half Pow once); integer Pow is computed through float64 and saturates, where a
multiply would wrap. The pass never changes a Pow whose exponent broadcasts x to another
shape.
"""

from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Node, Value
from ..ir.ops.registry import known_constant
from ..ir.types import float32, float64

EXPANDED = (2, 3)
"""The exponents rewritten to multiplies."""


def _exponent(node: Node) -> int | None:
    """The exponent of a float32 / float64 Pow node when it is a constant in `EXPANDED`
    (every element the same) that leaves x's type unchanged."""
    if node.op != "Pow":
        return None
    x, power = node.inputs
    if x.type.dtype not in (float32, float64) or node.outputs[0].type != x.type:
        return None
    c = known_constant(power)
    if c is None or c.size == 0 or c.dtype.kind not in "fiu":
        return None
    values = np.unique(np.asarray(c, np.float64))
    if values.size != 1 or values[0] not in EXPANDED:
        return None
    return int(values[0])


def _multiplies(node: Node, n: int) -> list[Node]:
    """The Mul nodes computing `node`'s output as x**n."""
    x, out = node.inputs[0], node.outputs[0]
    if n == 2:
        return [Node("Mul", [x, x], [out], name=node.name)]
    square = Value(f"{node.name}.square", x.type)
    return [Node("Mul", [x, x], [square], name=f"{node.name}.square"),
            Node("Mul", [square, x], [out], name=node.name)]


def expand_powers(graph: Graph) -> int:
    """Rewrite the top-level graph's Pow(x, 2) and Pow(x, 3) nodes in place as multiplies;
    returns how many were rewritten."""
    nodes, count = [], 0
    for node in graph.nodes:
        n = _exponent(node)
        if n is None:
            nodes.append(node)
            continue
        nodes += _multiplies(node, n)
        count += 1
    graph.nodes = nodes
    return count
