"""The target registry: the compiler layer reads targets as data and never compares a target's
name (issue 11, "targets as data")."""

import ast
from pathlib import Path

import pytest

import dnnc.compiler
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
    modules = sorted(COMPILER.glob("*.py"))
    assert len(modules) > 5   # the scan reads the real package, not an empty folder
    found = [f"{path.name}:{line}: {code}" for path in modules
             for line, code in name_comparisons(path.read_text(), set(REGISTRY))]
    assert not found, "\n".join(found)


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
    assert default_target() == "llvm"   # this CPU host has llvmlite: the dnnc install needs it


def test_entries_are_consistent():
    for spec in REGISTRY.values():
        assert set(spec.options) <= {"cpu", "passes", "dump_ir", "cache_size"}, spec.name
        # running passes means a machine to optimise for and the pass-control options
        assert spec.runs_passes == (spec.machine is not None), spec.name
        assert spec.runs_passes == ({"passes", "dump_ir"} <= set(spec.options)), spec.name
    assert using("cpu") == ["llvm"]


def test_an_option_a_target_does_not_use_names_the_targets_that_do():
    with pytest.raises(ArgumentError, match="cache_size does not apply to the numpy target, only "
                                        "to llvm"):
        driver.check_options("numpy", cache_size=4)
