"""The studies' modules import one another at most four deep (STYLE.md: a study reads another
study's result files, not its code), read from their source by AST."""

import ast
from pathlib import Path

import lbsgd.lab.studies

STUDIES = Path(lbsgd.lab.studies.__file__).parent
MAX_DEPTH = 4  # modules in the longest chain, the first included


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(tree: ast.AST, modules: set[str]) -> set[str]:
    """The package's modules that ``tree`` imports anywhere (in functions too), less what only
    a type checker reads (``if TYPE_CHECKING:``)."""
    out: set[str] = set()
    for node in ast.iter_child_nodes(tree):
        if _type_checking(node):
            continue
        if isinstance(node, ast.ImportFrom) and node.module == "lbsgd.lab.studies":
            out |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "lbsgd.lab.studies."
        ):
            out.add(node.module.split(".")[3])
        elif isinstance(node, ast.Import):
            out |= {
                a.name.split(".")[3] for a in node.names if a.name.startswith("lbsgd.lab.studies.")
            }
        out |= _imports(node, modules)
    return out & modules


def graph() -> dict[str, set[str]]:
    """Study module → the study modules it imports (the package's ``__init__`` is no study)."""
    paths = {p.stem: p for p in STUDIES.glob("*.py") if p.stem != "__init__"}
    return {m: _imports(ast.parse(p.read_text()), set(paths)) for m, p in paths.items()}


def longest(g: dict[str, set[str]]) -> list[str]:
    """The longest import chain of ``g``; AssertionError naming a cycle's modules."""
    memo: dict[str, list[str]] = {}

    def walk(m: str, path: tuple[str, ...]) -> list[str]:
        assert m not in path, f"import cycle: {' -> '.join((*path, m))}"
        if m not in memo:
            memo[m] = [m, *max((walk(n, (*path, m)) for n in g[m]), key=len, default=[])]
        return memo[m]

    return max((walk(m, ()) for m in g), key=len, default=[])


def test_the_depth_is_the_longest_chain_of_modules():
    g = {"a": {"b", "c"}, "b": {"c"}, "c": {"d"}, "d": set(), "e": {"d"}}
    assert longest(g) == ["a", "b", "c", "d"]


def test_the_studies_import_one_another_at_most_four_deep():
    chain = longest(graph())
    assert len(chain) <= MAX_DEPTH, " -> ".join(chain)
