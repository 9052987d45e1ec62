"""The config package's own layers: each module of lbsgd/config imports only those below it, read
from the source with ``ast`` as tests/test_layers.py reads the package's (every import, at module
level, under TYPE_CHECKING or inside a function), so no import is deferred to dodge a circle."""

import ast
from pathlib import Path

import lbsgd.config

CONFIG = Path(lbsgd.config.__file__).resolve().parent
# Bottom to top: the keys, the values derived from them, the step features' table, the checks,
# and the checked Config with its loading; the package's __init__ gathers them all.
LAYERS = ["optimizers", "schema", "derived", "step_features", "checks", "load", "__init__"]


def imported(source: str) -> set[str]:
    """The modules of lbsgd.config that ``source`` imports, wherever the import statement is."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        else:
            continue
        found |= {n.split(".")[2] for n in names if n.startswith("lbsgd.config.")}
    return found & set(LAYERS)


def upward(module: str, source: str) -> list[str]:
    """``module``'s imports of a module at its own layer or above it."""
    return [
        f"{module} imports {dep}"
        for dep in sorted(imported(source))
        if LAYERS.index(dep) >= LAYERS.index(module)
    ]


def test_every_module_of_the_config_package_has_a_layer():
    assert sorted(p.stem for p in CONFIG.glob("*.py")) == sorted(LAYERS)


def test_each_module_of_the_config_package_imports_only_those_below_it():
    found = [line for m in LAYERS for line in upward(m, (CONFIG / f"{m}.py").read_text())]
    assert found == []


def test_the_check_sees_an_upward_import_however_it_is_written():
    assert imported((CONFIG / "load.py").read_text()) >= {"schema", "checks", "derived"}
    for source in (
        "from lbsgd.config.checks import check_config",
        "def f():\n    from lbsgd.config import load\n",
        "if TYPE_CHECKING:\n    import lbsgd.config.load\n",
    ):
        assert upward("schema", source), source
    assert upward("checks", "from lbsgd.config import schema, optimizers") == []
