"""The target registry: the compiler layer reads targets as data and never compares a target's
name (issue 11, "targets as data")."""

import ast
import platform
from pathlib import Path

from dataclasses import replace

import numpy as np
import pytest

from dnnc.ir.ops.registry import Pattern

import dnnc
import dnnc.compiler
from dnnc import zoo
from dnnc.passes import manager
from dnnc.passes.convert_layout import REWRITES, convert_layout
from dnnc.compiler import driver
from dnnc.errors import ArgumentError
from dnnc.compiler.targets import REGISTRY, default_target, fastest_first, using

COMPILER = Path(dnnc.compiler.__file__).parent


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


def test_no_module_below_the_targets_names_one():
    """Passes, IR, frontends and shared backend code read the Target's fields (layouts,
    features, threads), never its name: only the compiler layer (the registry, the default
    target), a target's own package and the testing tools, which run targets as a user
    does, spell one."""
    root = COMPILER.parent
    allowed = [COMPILER, root / "testing", root / "backends" / "llvm", root / "backends" / "cuda"]
    modules = [p for p in sorted(root.rglob("*.py"))
               if not any(folder in p.parents for folder in allowed)
               and p != root / "backends" / "numpy.py"]
    assert root / "passes" / "convert_layout.py" in modules
    found = [f"{path.relative_to(root)}:{line}" for path in modules
             for line in name_literals(path.read_text(), set(REGISTRY))]
    assert not found, found


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
            assert all(machine.panel(layout) > 0 for layout in spec.layouts), spec.name
    assert using("cpu") == ["llvm"]
    assert using("precision") == ["cuda"]   # tensor cores (docs/cuda_backend.md, Precision)
    assert REGISTRY["llvm"].layouts == ("pack_dense", "pack_conv")


def test_the_passes_and_the_runtime_read_the_one_target_the_registry_builds(monkeypatch):
    """The machine given as `cpu` (its CPU, features and threads) with the layouts and fusion
    limits the registry declares for the target: the same object for convert_layout and the
    runtime."""
    from dnnc.backends.llvm.runtime import CPU_LEVELS, cpu_from

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
                                           panels=(("pack_dense", 8), ("pack_conv", 8)))
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
