"""The package read in one sitting: every function of lbsgd, closures and methods included, is at
most 12 in radon's cyclomatic complexity (a smell detector, not a target: 10 made functions split
only to pass it, STYLE 16). ruff's C901 holds it to the same number but counts less:
radon adds a branch for each ``and``/``or``, each conditional expression and each comprehension,
where prose assembly and option handling hide their branches (docs/ARCHITECTURE.md)."""

from pathlib import Path

from radon.complexity import cc_visit
from radon.visitors import Class

import lbsgd

PACKAGE = Path(lbsgd.__file__).resolve().parent
HELD = sorted(PACKAGE.rglob("*.py"))
LIMIT = 12


def _functions(blocks):
    """Every function, method and closure of radon's blocks (a class's own number is not one)."""
    for b in blocks:
        if isinstance(b, Class):
            yield from _functions(b.methods)
            yield from _functions(b.inner_classes)
        else:
            yield b
            yield from _functions(b.closures)


def test_every_function_of_the_package_is_at_most_12_in_radon():
    over = [
        f"{path.relative_to(PACKAGE.parent)}:{f.lineno} {f.fullname} ({f.complexity})"
        for path in HELD
        for f in _functions(cc_visit(path.read_text()))
        if f.complexity > LIMIT
    ]
    assert over == []


def test_the_check_sees_a_function_over_the_limit():
    branches = "\n".join(f"    if x == {i}:\n        return {i}" for i in range(LIMIT))
    (f,) = _functions(cc_visit(f"def f(x):\n{branches}\n    return -1\n"))
    assert f.complexity == LIMIT + 1
