"""The package's layers, read from its imports: every `import` of every module of dnnc, parsed
with `ast`, function-level imports included (an import hidden in a function still runs).

A module may import its own top-level package's modules and those of a LOWER layer, never a
module of a higher layer or of another package of its own layer:

    layer 0  errors, log, progress, version    what every layer reports with; the three
             levels                            decisions opt_level makes (passes, memory
                                               reuse, code generation)
    layer 1  ir                                graph, op registry, loop IR, Target
    layer 2  frontend, passes, backends, zoo   siblings: models in, graph rewrites, targets
                                               (with their registry), model builders; none
                                               imports another (a backend never runs a pass)
    layer 3  autotune                          spaces, cost model, measurement: over backends
    layer 4  compiler                          compile(), CompiledModel, cache, CLI
    layer 5  dnnc itself                       the package's API (`__init__`, `__main__`)
    layer 6  testing                           the fuzzer: runs targets through the API, as a
                                               user does

That is what the code needs (DESIGN.md's table, with the registry in backends/ since issue
29, so autotune and backends never import the compiler). Inside the compiler, where modules
may import each other, no import loop may run across its files.
"""

import ast
from pathlib import Path

import dnnc

PACKAGE = Path(dnnc.__file__).parent

LAYERS = {
    "errors": 0, "log": 0, "progress": 0, "version": 0, "levels": 0,
    "ir": 1,
    "frontend": 2, "passes": 2, "backends": 2, "zoo": 2,
    "autotune": 3,
    "compiler": 4,
    "__init__": 5, "__main__": 5,
    "testing": 6,
}


def module_name(path: Path) -> str:
    parts = ("dnnc",) + path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    rel = Path(*name.split(".")[1:])
    return (PACKAGE / rel).with_suffix(".py").is_file() or (PACKAGE / rel / "__init__.py").is_file()


def imports(source: str, name: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, module) of every dnnc module that `source` (module `name`) imports, at any depth
    of the code: `from . import x` is module x where x is one, else the package."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "dnnc"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[:len(base) - node.level + (1 if is_package else 0)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.split(".")[0] != "dnnc":
                continue
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                found.append((node.lineno, sub if is_module(sub) else module))
    return found


def top_of(module: str) -> str:
    """The top-level package (or module) of dnnc that `module` belongs to."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def layer_of(module: str) -> tuple[str, int]:
    return top_of(module), LAYERS[top_of(module)]


def package_imports() -> list[tuple[str, int, str]]:
    """(importing module, line, imported module) for every import in dnnc."""
    edges = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        edges += [(name, line, target) for line, target in
                  imports(path.read_text(), name, path.name == "__init__.py")]
    return edges


def upward(edges) -> list[str]:
    found = []
    for source, line, target in edges:
        (top, layer), (target_top, target_layer) = layer_of(source), layer_of(target)
        if top != target_top and target_layer >= layer:
            found.append(f"{source}:{line} imports {target} (layer {layer} -> {target_layer})")
    return found


def cycles(edges, within: str) -> list[list[str]]:
    """Import loops among the modules under `within` (each loop once, from its first
    module in sorted order)."""
    graph: dict[str, set[str]] = {}
    for source, _, target in edges:
        if source.startswith(within + ".") and target.startswith(within + ".") \
                and source != target:
            graph.setdefault(source, set()).add(target)
    found = []
    for start in sorted(graph):
        stack = [(start, [start])]
        while stack:
            node, trail = stack.pop()
            for nxt in sorted(graph.get(node, ())):
                if nxt == start:
                    found.append(trail)
                elif nxt not in trail and nxt > start:
                    stack.append((nxt, trail + [nxt]))
    return found


def test_every_top_level_package_has_a_layer():
    tops = {top_of(module_name(p)) for p in PACKAGE.rglob("*.py")}
    assert tops <= set(LAYERS), tops - set(LAYERS)


def test_no_import_runs_upwards():
    edges = package_imports()
    assert len(edges) > 300   # the scan reads the real package
    found = upward(edges)
    assert not found, "\n".join(found)


def test_autotune_and_backends_never_import_the_compiler():
    found = [f"{s}:{line} imports {t}" for s, line, t in package_imports()
             if layer_of(s)[0] in ("autotune", "backends") and t.startswith("dnnc.compiler")]
    assert not found, "\n".join(found)


def test_no_import_loop_across_the_compilers_files():
    found = cycles(package_imports(), "dnnc.compiler")
    assert not found, "\n".join(" -> ".join(c + c[:1]) for c in found)


def test_the_scan_finds_a_planted_upward_import_inside_a_function():
    source = "def f():\n    from ...compiler.driver import compile\n"
    edges = [("dnnc.backends.llvm.entry", line, t)
             for line, t in imports(source, "dnnc.backends.llvm.entry", False)]
    assert edges == [("dnnc.backends.llvm.entry", 2, "dnnc.compiler.driver")]
    assert len(upward(edges)) == 1
    # a sibling of the same layer is refused too; its own package and lower layers are not
    assert upward([("dnnc.backends.plan", 1, "dnnc.passes.manager")])
    assert not upward([("dnnc.backends.plan", 1, "dnnc.backends.memory"),
                       ("dnnc.backends.plan", 1, "dnnc.ir.graph")])


def test_the_scan_resolves_relative_and_package_imports():
    assert imports("from . import cache", "dnnc.compiler.driver", False) == \
        [(1, "dnnc.compiler.cache")]
    assert imports("from .. import __version__", "dnnc.autotune.tuner", False) == [(1, "dnnc")]
    assert imports("from .runtime import x", "dnnc.backends.numpy", True) == \
        [(1, "dnnc.backends.numpy.runtime")]


def test_the_loop_scan_finds_a_planted_loop():
    edges = [("dnnc.compiler.a", 1, "dnnc.compiler.b"), ("dnnc.compiler.b", 9, "dnnc.compiler.c"),
             ("dnnc.compiler.c", 3, "dnnc.compiler.a"), ("dnnc.compiler.c", 4, "dnnc.ir.graph")]
    assert cycles(edges, "dnnc.compiler") == [["dnnc.compiler.a", "dnnc.compiler.b",
                                                "dnnc.compiler.c"]]
    assert cycles(edges[:2], "dnnc.compiler") == []
