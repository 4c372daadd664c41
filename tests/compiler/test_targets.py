"""The target registry: the compiler layer and the autotuner read targets as data and never
spell a target's name (issue 11, "targets as data"; issue 29, "a target is one package"): not
in a comparison, not in a table, tuple or dict of their own. A new target is one package and
one registry line (the toy target below)."""

import ast
import importlib
import platform
import sys
from pathlib import Path

from dataclasses import replace

import numpy as np
import pytest

from dnnc.ir.ops.registry import Pattern

import dnnc
import dnnc.compiler
from dnnc import zoo
from dnnc.passes import manager
from dnnc.passes.convert_layout import PACKINGS, REWRITES, convert_layout
from dnnc.compiler import driver
from dnnc.errors import ArgumentError
from dnnc.backends.registry import ENTRIES, REGISTRY, default_target, fastest_first, using

COMPILER = Path(dnnc.compiler.__file__).parent
ROOT = COMPILER.parent


def name_comparisons(source: str, names) -> list[tuple[int, str]]:
    """(line, code) of every comparison in `source` with one of `names` as a string literal,
    alone (`t == "llvm"`) or in a literal tuple, list or set (`t in ("llvm", "numpy")`)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        literals = [e for o in operands
                    for e in (o.elts if isinstance(o, (ast.Tuple, ast.List, ast.Set)) else [o])]
        if any(isinstance(e, ast.Constant) and e.value in names for e in literals):
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_no_compiler_module_compares_a_target_name():
    modules = sorted(COMPILER.rglob("*.py"))   # the cli/ package too
    assert len(modules) > 5   # the scan reads the real package, not an empty folder
    found = [f"{path.relative_to(COMPILER)}:{line}: {code}" for path in modules
             for line, code in name_comparisons(path.read_text(), set(REGISTRY))]
    assert not found, "\n".join(found)


def name_literals(source: str, names) -> list[int]:
    """Lines of `source` with one of `names` as a string literal (`{"llvm": [...]}`)."""
    return sorted(node.lineno for node in ast.walk(ast.parse(source))
                  if isinstance(node, ast.Constant) and node.value in names)


def target_packages() -> list[Path]:
    """The folder of every registered target's package (`backends/<target>/`)."""
    return [ROOT / "backends" / entry.strip(".").split(".")[0] for entry in ENTRIES]


def test_no_module_below_the_targets_names_one():
    """Passes, IR, frontends, shared backend code (the registry included) and the autotuner
    read the Target's fields (layouts, features, threads), never its name: only a target's
    own package and the testing tools, which run targets as a user does, spell one (the
    compiler layer spells one only in what it tells the user, below)."""
    allowed = [COMPILER, ROOT / "testing", *target_packages()]
    assert ROOT / "backends" / "numpy" in allowed
    modules = [p for p in sorted(ROOT.rglob("*.py"))
               if not any(folder in p.parents for folder in allowed)]
    assert ROOT / "passes" / "convert_layout.py" in modules
    assert ROOT / "backends" / "registry.py" in modules
    assert ROOT / "autotune" / "measure.py" in modules
    found = [f"{path.relative_to(ROOT)}:{line}" for path in modules
             for line in name_literals(path.read_text(), set(REGISTRY))]
    assert not found, found


ARRAY_KINDS = ("to", "outputs")
"""Arguments naming a kind of array (`to="numpy"`: NumPy arrays), not a target."""


def target_names(source: str, names) -> list[tuple[int, str]]:
    """(line, code) of every string literal in `source` equal to one of `names`: in a
    comparison, a table, a tuple, a dict key or an argument. What it tells a person is left
    out: docstrings and the text of f-strings (messages), and the array kinds of `to=` and
    `outputs=`."""
    tree = ast.parse(source)
    spared = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) \
                and node.body and isinstance(node.body[0], ast.Expr):
            spared.add(id(node.body[0].value))     # a docstring
        elif isinstance(node, ast.JoinedStr):
            spared.update(id(v) for v in node.values)
        elif isinstance(node, ast.keyword) and node.arg in ARRAY_KINDS:
            spared.add(id(node.value))
    lines = source.splitlines()
    return [(node.lineno, lines[node.lineno - 1].strip()) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and node.value in names
            and id(node) not in spared]


def test_no_compiler_or_autotune_module_names_a_target():
    """The compiler layer and the autotuner keep no table of targets (`CACHED_TARGETS`, an
    `--emit` suffix per kind): what differs between targets is a field of their registry
    entries. Names appear only in docstrings and messages."""
    modules = sorted(COMPILER.rglob("*.py")) + sorted((ROOT / "autotune").rglob("*.py"))
    assert COMPILER / "cache.py" in modules and ROOT / "autotune" / "measure.py" in modules
    found = [f"{path.relative_to(ROOT)}:{line}: {code}" for path in modules
             for line, code in target_names(path.read_text(), set(REGISTRY))]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("planted", [
    'CACHED_TARGETS = ("llvm", "cuda")',
    'EMIT_SUFFIX = {"llvm-ir": ".ll", "cuda": ".cu"}',
    'cached = target in ["llvm"]',
    'spec = REGISTRY["numpy"]',
    'compile(model, target="llvm")',
    'if target != "llvm":\n    pass',
])
def test_the_name_scan_finds_a_planted_table(planted):
    found = target_names('"""The module, about llvm."""\nimport os\n' + planted, set(REGISTRY))
    assert found and {line for line, _ in found} == {3}, found


def test_the_name_scan_spares_docstrings_messages_and_array_kinds():
    source = ('"""Targets: llvm."""\n'
              'def f(target):\n'
              '    """numpy"""\n'
              '    model.run(x, to="numpy")\n'
              '    compile(m, t, outputs="numpy")\n'
              '    raise ArgumentError(f"the {target} target, not llvm")\n')
    assert target_names(source, set(REGISTRY)) == []


@pytest.mark.parametrize("planted", [
    'if target != "llvm":\n    pass',
    'ok = "numpy" == model.target',
    'ok = args.target in ("llvm", "cuda")',
    'ok = t not in {"numpy"}',
])
def test_the_scan_finds_a_planted_comparison(planted):
    found = name_comparisons("import os\n" + planted, set(REGISTRY))
    assert [line for line, _ in found] == [2], found


def test_the_scan_ignores_names_that_are_not_compared():
    assert name_comparisons('t = "llvm"\nspec = REGISTRY["numpy"]\nok = t == "asm"',
                            set(REGISTRY)) == []


def test_default_target_is_the_fastest_available():
    available = [REGISTRY[n] for n in fastest_first() if REGISTRY[n].available()]
    assert default_target() == available[0].name
    # the dnnc install needs llvmlite; a GPU host with CuPy prefers cuda
    assert default_target() == ("cuda" if REGISTRY["cuda"].available() else "llvm")


def test_api_jit_and_cli_share_the_default_target(monkeypatch):
    """`dnnc.compile`, `dnnc.jit` and the CLI all default to `default_target()`; with the
    registry's speeds swapped, all three follow it (none hard-codes a name)."""
    from dnnc.compiler.cli import build_parser

    mlp = zoo.build("mlp", batch=2, in_features=4, hidden=(8,), classes=3)
    assert dnnc.compile(mlp).target == default_target()
    assert dnnc.jit(lambda x: x * 2).target == default_target()
    monkeypatch.setitem(REGISTRY, "numpy", replace(REGISTRY["numpy"], speed=99))
    assert default_target() == "numpy"
    assert dnnc.compile(mlp).target == "numpy"
    assert dnnc.jit(lambda x: x * 2).target == "numpy"
    parser = build_parser()
    for command in ("compile", "tune", "compare"):
        assert parser.parse_args([command, "m.onnx", *(["--log", "l"] if command == "tune"
                                                     else [])]).target == "numpy", command


def test_entries_are_consistent():
    for spec in REGISTRY.values():
        assert set(spec.options) <= {"cpu", "passes", "dump_ir", "cache_size", "tuning_log",
                                     "precision"}, spec.name
        # running passes means a machine to optimise for and the pass-control options
        assert spec.runs_passes == (spec.machine is not None), spec.name
        assert spec.runs_passes == ({"passes", "dump_ir"} <= set(spec.options)), spec.name
        assert set(spec.layouts) <= set(REWRITES), spec.name
        # a target that generates code schedules every anchor pattern with its own templates
        # and gives a panel width for every layout it packs
        if spec.generates_code:
            table = spec.templates()
            assert {key for key in table if key[0] == spec.name} == \
                {(spec.name, pattern) for pattern in Pattern}, spec.name
            machine = spec.target()
            assert all(machine.panel(layout) > 0 for layout in spec.layouts
                       if layout in PACKINGS), spec.name
        assert spec.returns, spec.name
        # --emit writes each kind of code to a file with the suffix the entry gives
        assert all(suffix.startswith(".") for suffix in spec.emits.values()), spec.name
        assert set(spec.source_aliases).isdisjoint(spec.emits), spec.name
        assert not spec.cached or spec.generates_code, spec.name   # caching keeps code
        # --mcpu/--mattr are read by the entry of a target that takes the cpu option
        assert (spec.cpu_from is not None) == ("cpu" in spec.options), spec.name
        assert all(type(v) is str for v in spec.versions()), spec.name
    # the returned kinds beyond numpy are device arrays, read back through the entry
    assert [n for n, s in REGISTRY.items() if s.from_dlpack] == \
        [n for n, s in REGISTRY.items() if set(s.returns) - {"numpy"}]
    # the compile cache keys an llvm compile by llvmlite's and LLVM's versions
    import llvmlite

    assert REGISTRY["llvm"].versions()[0] == llvmlite.__version__
    assert REGISTRY["llvm"].cpu_from("x86-64", None).cpu == "x86-64"
    assert using("cpu") == ["llvm"]
    # cuda's tensor cores (docs/cuda_backend.md, Precision), llvm's bf16 products
    assert using("precision") == ["llvm", "cuda"]
    assert REGISTRY["llvm"].precisions == ("fp32", "bf16")
    assert REGISTRY["llvm"].layouts == ("sparse_weights", "winograd_conv", "pack_dense",
                                        "pack_conv")
    assert [n for n, s in REGISTRY.items() if s.cached] == ["llvm", "cuda"]


def test_each_entry_lives_in_its_targets_package():
    """`ENTRIES` names one module per target, `backends/<target>/entry.py`, whose `SPEC` is
    the registry's entry for that name, in that order."""
    assert [e.strip(".").split(".") for e in ENTRIES] == [[n, "entry"] for n in REGISTRY]
    for entry in ENTRIES:
        module = importlib.import_module(entry, "dnnc.backends")
        assert REGISTRY[module.SPEC.name] is module.SPEC


def test_listing_the_targets_imports_neither_llvmlite_nor_cupy():
    """Availability stays lazy: the registry's entries are cheap to import."""
    import subprocess

    code = ("import sys; from dnnc.backends.registry import REGISTRY, fastest_first; "
            "fastest_first(); print(sorted({'llvmlite', 'cupy'} & set(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout.strip() == "[]", done.stdout


def test_the_passes_and_the_runtime_read_the_one_target_the_registry_builds(monkeypatch):
    """The machine given as `cpu` (its CPU, features and threads) with the layouts and fusion
    limits the registry declares for the target: the same object for convert_layout and the
    runtime."""
    from dnnc.backends.llvm.cpu import CPU_LEVELS, cpu_from

    seen = []
    monkeypatch.setattr(manager, "convert_layout",
                        lambda graph, target: seen.append(target) or convert_layout(graph,
                                                                                    target))
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    mlp = zoo.build("mlp", batch=3, hidden=(8,), in_features=4, classes=3)
    baseline = next(iter(CPU_LEVELS.get(platform.machine(), {"generic": ()})))
    machine = replace(cpu_from(baseline), threads=1)   # not this host's CPU, nor its threads
    model = dnnc.compile(mlp, "llvm", cpu=machine)
    assert seen == [model.runtime.target]
    # 128-bit vectors: the templates' default panels are two vectors of float32
    assert model.runtime.target == replace(machine, layouts=REGISTRY["llvm"].layouts,
                                           fusion=REGISTRY["llvm"].fusion(),
                                           panels=(("pack_dense", 8), ("pack_conv", 8)),
                                           half_arithmetic=())
    assert model.runtime.threads == 1 and model.runtime.target.vector_bits == 128
    assert "MatMulPacked" in str(model.graph)     # the registry's layouts were applied
    np.testing.assert_allclose(model(x), dnnc.compile(mlp, "numpy")(x), rtol=1e-5, atol=1e-6)


def test_every_runtime_carries_its_target():
    mlp = zoo.build("mlp", batch=2, hidden=(8,), in_features=4, classes=3)
    for name in [n for n in fastest_first() if REGISTRY[n].available()]:
        target = dnnc.compile(mlp, name).runtime.target
        assert target == REGISTRY[name].target() and target.name == name


def test_an_option_a_target_does_not_use_names_the_targets_that_do():
    with pytest.raises(ArgumentError, match="cache_size does not apply to the numpy target, only "
                                        "to llvm"):
        driver.check_options("numpy", cache_size=4)


def write_toy_target(folder: Path) -> str:
    """A copy of the numpy target's package under the name `toy` (its relative imports made
    absolute, as a package outside dnnc writes them), in `folder`; its package name."""
    package = folder / "toy_target"
    package.mkdir()
    for source in sorted((ROOT / "backends" / "numpy").glob("*.py")):
        text = source.read_text().replace("from ...", "from dnnc.") \
            .replace("from ..target_spec", "from dnnc.backends.target_spec")
        (package / source.name).write_text(text.replace('TargetSpec("numpy", ',
                                                        'TargetSpec("toy", '))
    return package.name


def test_a_third_target_is_one_package_and_one_registry_line(tmp_path, monkeypatch, rng):
    """A toy target (the numpy reference, copied under another name) compiles, runs, is
    offered by the CLI and saves and loads, with nothing changed outside its own package but
    the one registry line (monkeypatch restores the registry after the test)."""
    from dnnc.compiler.cli import build_parser

    monkeypatch.syspath_prepend(str(tmp_path))
    name = write_toy_target(tmp_path)
    entry = importlib.import_module(f"{name}.entry")
    monkeypatch.setitem(REGISTRY, entry.SPEC.name, entry.SPEC)   # the registry line

    mlp = zoo.build("mlp", batch=2, in_features=4, hidden=(8,), classes=3)
    x = rng.standard_normal((2, 4)).astype(np.float32)
    model = dnnc.compile(mlp, target="toy")
    assert model.target == "toy" and model.runtime.target.name == "toy"
    assert type(model.runtime).__module__ == f"{name}.runtime"   # its own runtime, not numpy's
    np.testing.assert_array_equal(model(x), dnnc.compile(mlp, target="numpy")(x))
    path = tmp_path / "toy.dnnc"
    model.save(path)
    loaded = dnnc.load(path)
    assert loaded.target == "toy" and type(loaded.runtime).__module__ == f"{name}.runtime"
    np.testing.assert_array_equal(loaded(x), model(x))
    assert build_parser().parse_args(["compile", "m.onnx", "--target", "toy"]).target == "toy"
    with pytest.raises(ArgumentError, match="cache_size does not apply to the toy target"):
        dnnc.compile(mlp, target="toy", cache_size=4)
    monkeypatch.undo()
    assert "toy" not in REGISTRY
