"""The package as installed: typed (PEP 561), its dependencies the ones it imports, and
package docstrings that describe what is there."""

import ast
import tomllib
from pathlib import Path

import dnnc

REPO = Path(__file__).resolve().parents[1]
PACKAGE = Path(dnnc.__file__).parent


def test_py_typed_ships_with_the_package():
    """Type checkers read an installed package's annotations only with a `py.typed` marker,
    which setuptools ships only as declared package data."""
    assert (PACKAGE / "py.typed").is_file()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "py.typed" in project["tool"]["setuptools"]["package-data"]["dnnc"]


def test_every_dependency_is_imported_and_networkx_is_gone():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    names = {d.split(">")[0].split("=")[0].split("[")[0].strip()
             for d in project["project"]["dependencies"]}
    modules = {"xgboost-cpu": "xgboost", "ml_dtypes": "ml_dtypes"}
    imported = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    assert "networkx" not in names | imported
    for name in names:
        assert modules.get(name, name) in imported, name


def test_package_docstrings_name_no_future():
    """A package's docstring says what it holds, not what was planned before it existed
    ("later, llvm and cuda", "to come")."""
    for init in PACKAGE.rglob("__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "to come" not in doc and "(later)" not in doc and ", later," not in doc, init
        if init.parent.name in ("passes", "autotune", "frontend"):   # each module named
            missing = [m.stem for m in init.parent.glob("*.py")
                       if m.name != "__init__.py" and m.stem not in doc]
            assert missing == [], init
