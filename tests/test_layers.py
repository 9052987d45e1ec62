"""The package's layers (docs/ARCHITECTURE.md): imports point down only, with no cycle.

Read from the source with ``ast`` (every ``import lbsgd.x`` and ``from lbsgd… import …``, at module
level or inside a function), so a lazy import is held to the same rule as an eager one."""

import ast
import subprocess
import sys
from pathlib import Path

import lbsgd

PACKAGE = Path(lbsgd.__file__).resolve().parent

# Bottom to top, as in docs/ARCHITECTURE.md. A unit is a top-level module or subpackage of lbsgd;
# imports inside one unit are its own business. A unit may import units of its own band (the
# graph stays acyclic) and of the bands below, never above.
BANDS = [
    ("vocabulary", {"config", "registry"}),
    (
        "mechanisms",
        {
            "isa",
            "comm",
            "distributed",
            "precision",
            "schedules",
            "noise_scale",
            "staleness",
            "costmodel",
            "launch",
            "jobs",
            "seeding",
        },
    ),
    ("components", {"data", "models", "optim", "network"}),
    ("run state", {"checkpoint", "tracking", "environment", "rundir", "evaluation", "progress"}),
    ("loops", {"cadence", "features", "lifecycle", "parameter_server", "trainer"}),
    ("entry", {"entry"}),
    ("harness", {"bench", "plan", "__init__"}),
    ("lab: sweeps", {"lab", "lab.experiments"}),
    ("lab: studies", {"lab.stats", "lab.findings", "lab.studies"}),
    ("lab: reports", {"lab.verify", "lab.report", "lab.execute", "lab.reproduce"}),
    ("command line", {"cli", "__main__"}),
]
BAND = {unit: i for i, (_, units) in enumerate(BANDS) for unit in units}
LAB = {unit for unit in BAND if unit.split(".")[0] == "lab"}
COMMAND_LINE = {"cli", "__main__"}  # above both halves: it dispatches to the library and the lab


def unit_of(path: Path) -> str:
    parts = [p.removesuffix(".py") for p in path.relative_to(PACKAGE).parts]
    if parts[0] == "lab" and len(parts) > 1 and parts[1] != "__init__":
        return f"lab.{parts[1]}"
    return parts[0]


def imported_units(path: Path) -> set[str]:
    """The lbsgd units a module imports (``from lbsgd import x`` counts x when it is a unit)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
            if node.module in ("lbsgd", "lbsgd.lab"):
                names = [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] != "lbsgd":
                continue
            if parts[1:2] == ["lab"]:
                found.add(
                    f"lab.{parts[2]}" if len(parts) > 2 and f"lab.{parts[2]}" in BAND else "lab"
                )
            else:
                found.add(parts[1] if len(parts) > 1 and parts[1] in BAND else "__init__")
    return found


def graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        unit = unit_of(path)
        edges.setdefault(unit, set()).update(imported_units(path) - {unit})
    return edges


def test_every_unit_of_the_package_has_a_band():
    assert set(graph()) - set(BAND) == set(), "add the new module to BANDS and ARCHITECTURE.md"
    assert set(BAND) - set(graph()) == set(), "a module in BANDS no longer exists"


def test_imports_point_down_only():
    upward = [
        f"{unit} ({BANDS[BAND[unit]][0]}) imports {dep} ({BANDS[BAND[dep]][0]})"
        for unit, deps in graph().items()
        for dep in sorted(deps)
        if BAND[dep] > BAND[unit]
    ]
    assert upward == []


def test_the_library_never_imports_the_lab():
    """The package's two halves (DESIGN 2): every module outside lbsgd/lab/ but the command line
    imports nothing of the lab, eagerly or lazily; the lab's studies do import the library."""
    edges = graph()
    reverse = [
        f"{unit} imports {dep}"
        for unit, deps in sorted(edges.items())
        if unit not in LAB | COMMAND_LINE
        for dep in sorted(deps & LAB)
    ]
    assert reverse == []
    assert edges["lab.studies"] - LAB  # the graph reads the lab's imports: the test can fail


def test_the_import_graph_has_no_cycle():
    edges, state, cycles = graph(), {}, []

    def visit(unit: str, stack: list[str]) -> None:
        state[unit] = "open"
        for dep in sorted(edges.get(unit, ())):
            if state.get(dep) == "open":
                cycles.append(" -> ".join([*stack[stack.index(dep) :], dep]))
            elif dep not in state:
                visit(dep, [*stack, dep])
        state[unit] = "done"

    for unit in sorted(edges):
        if unit not in state:
            visit(unit, [unit])
    assert cycles == []


def test_the_derived_values_import_nothing_of_the_checks():
    """config/checks.py reads config/derived.py (lr_scale), and derived.py, lazily or not, reads
    nothing of checks.py: the layout check (check_world) sits beside the values it checks."""
    found = set()
    for node in ast.walk(ast.parse((PACKAGE / "config" / "derived.py").read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    assert "lbsgd.config.schema" in found  # the imports are read: the test can fail
    assert not {m for m in found if m.startswith("lbsgd.config.checks")}


def test_only_distributed_and_comm_import_torch_distributed():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if unit_of(path) in {"distributed", "comm"}:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            if any(n == "torch.distributed" or n.startswith("torch.distributed.") for n in names):
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert offenders == []


def test_importing_the_package_leaves_torchvision_unimported():
    # torchvision costs 1-2 s of CPU to import: only a torchvision model's builder and the
    # ImageNet folder reader import it, when called, so that a notebook's kernel does not pay it
    code = (
        "import sys, lbsgd.cli, lbsgd.lab.experiments, lbsgd.entry, lbsgd.lab.report, lbsgd.lab.verify; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torchvision'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=PACKAGE.parent
    )
    assert out.stdout.strip() == "[]", out.stdout


def test_no_test_uses_a_private_name_of_the_package():
    """Tests hold the public API: no ``from lbsgd… import _x`` and no ``module._x`` on a name bound
    to an lbsgd module (dunder names aside)."""
    private = []
    for path in sorted(Path(__file__).parent.glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        modules = set()  # local names bound to lbsgd modules
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules |= {a.asname or a.name for a in node.names if a.name.startswith("lbsgd")}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lbsgd"):
                for a in node.names:
                    if a.name.startswith("_") and not a.name.startswith("__"):
                        private.append(f"{path.name}:{node.lineno} imports {a.name}")
                    if (PACKAGE.parent / node.module.replace(".", "/") / a.name).exists() or (
                        PACKAGE.parent / node.module.replace(".", "/") / f"{a.name}.py"
                    ).exists():
                        modules.add(a.asname or a.name)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in modules
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                private.append(f"{path.name}:{node.lineno} uses {node.value.id}.{node.attr}")
    assert private == []


def test_no_test_module_imports_another():
    """What test modules share lives in tests/helpers.py or tests/conftest.py, under public names:
    no file of tests/ imports a ``test_*`` module (a test module is run, never a library), and none
    imports an underscored name from the shared modules."""
    found = []
    for path in sorted(Path(__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                modules, names = [a.name for a in node.names], []
            elif isinstance(node, ast.ImportFrom) and node.module:
                modules, names = [node.module], [a.name for a in node.names]
            else:
                continue
            for module in modules:
                last = module.split(".")[-1]
                if last.startswith("test_") or module.startswith("tests."):
                    found.append(f"{path.name}:{node.lineno} imports {module}")
                if last in ("helpers", "conftest"):
                    private = [n for n in names if n.startswith("_")]
                    found += [f"{path.name}:{node.lineno} imports {module}.{n}" for n in private]
    assert found == []
