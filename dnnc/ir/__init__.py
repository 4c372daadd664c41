"""The IRs: element and tensor types, the graph IR, the op registry, and the interpreter."""
