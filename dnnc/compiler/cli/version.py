"""`dnnc --version`: dnnc's version, each target with whether this host can run it and its
libraries' versions (or why not), and the default target.

It only reads the target registry (each entry's `available` and `about`); it never
compiles.
"""

from __future__ import annotations

import argparse

import numpy as np

from ...version import __version__


def version_text() -> str:
    """What `dnnc --version` prints: dnnc's version, each target with whether this host can
    run it and its libraries' versions (or why not), and the default target."""
    import platform

    import onnx

    from ...backends.registry import REGISTRY, default_target

    lines = [f"dnnc {__version__} (Python {platform.python_version()}, NumPy {np.__version__},"
             f" onnx {onnx.__version__})", "targets:"]
    width = max(map(len, REGISTRY))
    for spec in REGISTRY.values():
        lines.append(f"  {spec.name:<{width}}  {'yes' if spec.available() else 'no '}  "
                     f"{spec.about()}")
    lines.append(f"default target: {default_target()}")
    return "\n".join(lines)


class Version(argparse.Action):
    """`--version`: print `version_text()` and exit 0, before any command is parsed."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_text())
        parser.exit()
