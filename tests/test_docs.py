"""The documentation holds together: README.md is a short front door whose contents reach every page
of docs/, every relative link of README.md and docs/*.md leads to a file (and a ``#anchor`` to one
of its headings), docs/ARCHITECTURE.md names every module of the package, and every list of the
profiles names them all.

Each check is a function of the text it reads, so that each is also tested on a text that breaks
it (a broken link, a missing module, a profile left out)."""

import re
from pathlib import Path

import lbsgd
from lbsgd.lab.studies.scales import PROFILES

REPO = Path(__file__).resolve().parents[1]
PACKAGE = Path(lbsgd.__file__).resolve().parent
README = REPO / "README.md"
ARCHITECTURE = REPO / "docs" / "ARCHITECTURE.md"
DOCS = [README, *sorted((REPO / "docs").glob("*.md"))]

README_MAX_LINES = 250
# the line after this marker lists the profiles (lbsgd.lab.studies.scales.PROFILES), each in backticks
PROFILES_MARKER = "<!-- profiles -->"

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$")
INLINE_CODE = re.compile(r"`[^`]+`")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
BACKTICKED = re.compile(r"`([^`]+)`")


def prose(text: str) -> list[str]:
    """The lines of a markdown text outside fenced code blocks (a fenced line reads as empty)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            lines.append("")
        else:
            lines.append("" if fenced else line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lowercase, punctuation dropped except '-' and '_', each space
    a '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors of a markdown text's headings; a repeated one gets -1, -2, … as on GitHub."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in prose(text):
        m = HEADING.match(line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(text: str) -> list[str]:
    """Every link target of a markdown text's prose (code blocks and code spans left out)."""
    return LINK.findall(INLINE_CODE.sub("``", "\n".join(prose(text))))


def link_problems(doc: Path) -> list[str]:
    """Each relative link of ``doc`` that leads nowhere: a missing file, or a ``#anchor`` that no
    heading of its file has."""
    problems = []
    text = doc.read_text()
    for target in links(text):
        if SCHEME.match(target):
            continue  # http(s), mailto: not this repository's files
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            problems.append(f"{doc.name}: {target}: no such file")
        elif anchor and (file.suffix != ".md" or anchor not in anchors(file.read_text())):
            problems.append(f"{doc.name}: {target}: no heading #{anchor} in {file.name}")
    return problems


def package_paths() -> list[str]:
    """Each module and folder of the package as docs/ARCHITECTURE.md names it: ``lbsgd/x.py``
    (other than __init__ and __main__), ``lbsgd/sub/``, the same in ``lbsgd/lab/``, and
    ``lbsgd/lab/studies/x.py``."""
    paths = []
    for folder in (PACKAGE, PACKAGE / "lab"):
        prefix = folder.relative_to(PACKAGE.parent).as_posix()
        for path in sorted(folder.iterdir()):
            if path.is_dir() and not path.name.startswith((".", "__")) and path.name != "lab":
                paths.append(f"{prefix}/{path.name}/")
            elif path.suffix == ".py" and path.stem not in ("__init__", "__main__"):
                paths.append(f"{prefix}/{path.name}")
    for path in sorted((PACKAGE / "lab" / "studies").glob("*.py")):
        if path.stem != "__init__":
            paths.append(f"lbsgd/lab/studies/{path.name}")
    return paths


def unnamed(text: str, paths: list[str]) -> list[str]:
    """The paths that ``text`` does not name."""
    return [p for p in paths if not re.search(rf"(?<![\w/]){re.escape(p)}(?![\w.])", text)]


def profile_problems(name: str, text: str) -> list[str]:
    """Each marked list of profiles that leaves one out, and each line that names three or more
    profiles (in backticks) without the marker before it."""
    problems = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        named = set(BACKTICKED.findall(line))
        marked = i > 0 and lines[i - 1].strip() == PROFILES_MARKER
        if line.strip() == PROFILES_MARKER:
            listed = set(BACKTICKED.findall(lines[i + 1])) if i + 1 < len(lines) else set()
            missing = [p for p in PROFILES if p not in listed]
            if missing:
                problems.append(f"{name}:{i + 2}: the list of profiles lacks {missing}")
        elif not marked and len(named & set(PROFILES)) >= 3:
            problems.append(f"{name}:{i + 1}: a list of profiles without {PROFILES_MARKER}")
    return problems


def test_readme_is_a_front_door_of_at_most_250_lines():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"


def test_readme_links_every_page_of_docs():
    linked = {
        (README.parent / t.partition("#")[0]).resolve()
        for t in links(README.read_text())
        if not SCHEME.match(t)
    }
    assert [d.name for d in DOCS[1:] if d.resolve() not in linked] == []


def test_every_relative_link_of_readme_and_docs_resolves():
    assert [p for doc in DOCS for p in link_problems(doc)] == []


def test_the_link_check_finds_a_missing_file_and_a_missing_heading(tmp_path):
    (tmp_path / "b.md").write_text("# B\n\n## Weights & Biases\n\n## Block `x_y`: z (a, b)\n")
    (tmp_path / "a.md").write_text(
        "[ok](b.md) [ok](b.md#weights--biases) [ok](b.md#block-x_y-z-a-b) [ok](#a)\n"
        "[web](https://example.org/x) `[code](nowhere.md)`\n"
        "```\n[fenced](nowhere.md)\n```\n"
        "[gone](missing.md) [wrong](b.md#nope) [self](#nope)\n"
        "# A\n"
    )
    assert link_problems(tmp_path / "a.md") == [
        "a.md: missing.md: no such file",
        "a.md: b.md#nope: no heading #nope in b.md",
        "a.md: #nope: no heading #nope in a.md",
    ]


def test_headings_slug_as_on_github():
    assert slug("Weights & Biases") == "weights--biases"
    assert slug("Block momentum: BMUF (`block_momentum`, `block_lr`)") == (
        "block-momentum-bmuf-block_momentum-block_lr"
    )
    assert anchors("# A\n## A\n```\n# not a heading\n```\n") == {"a", "a-1"}


def test_architecture_names_every_module_of_the_package():
    paths = package_paths()
    assert "lbsgd/optim.py" in paths and "lbsgd/lab/studies/steps_to_target.py" in paths
    assert "lbsgd/data/" in paths
    assert unnamed(ARCHITECTURE.read_text(), paths) == []


def test_the_module_check_finds_a_module_left_out():
    text = "lbsgd/optim.py  lbsgd/lab/studies/warmup.py"
    assert unnamed(text, ["lbsgd/optim.py", "lbsgd/warmup.py", "lbsgd/lab/studies/warmup.py"]) == [
        "lbsgd/warmup.py"
    ]


def test_every_list_of_profiles_names_every_profile():
    assert PROFILES_MARKER in README.read_text(), "README lists the profiles after the marker"
    assert [p for doc in DOCS for p in profile_problems(doc.name, doc.read_text())] == []


def test_the_profile_check_finds_a_profile_left_out():
    listed = ", ".join(f"`{p}`" for p in PROFILES)
    assert profile_problems("ok.md", f"{PROFILES_MARKER}\n{listed}\n") == []
    short = ", ".join(f"`{p}`" for p in PROFILES if p != "fashion-long")
    assert profile_problems("x.md", f"text\n{PROFILES_MARKER}\n{short}\n") == [
        "x.md:3: the list of profiles lacks ['fashion-long']"
    ]
    assert profile_problems("y.md", "`smoke`, `cpu`, `cifar10`, `imagenet`\n") == [
        f"y.md:1: a list of profiles without {PROFILES_MARKER}"
    ]


def test_each_notebooks_profile_help_names_every_profile_that_replays_its_study():
    import nbformat

    from lbsgd.lab.studies import scales

    for nb in sorted((REPO / "notebooks").glob("[0-9]*_*.ipynb")):
        study = nb.stem.split("_", 1)[1]
        (cell,) = [
            c
            for c in nbformat.read(nb, as_version=4).cells
            if "parameters" in c.metadata.get("tags", [])
        ]
        line = next(x for x in cell.source.splitlines() if x.startswith("profile: str"))
        if "# scale:" not in line:  # notebook 10: its own measurement sizes, not the scales
            continue
        named = set(re.findall(r"[\w-]+(?= \()", line.split("# scale:", 1)[1]))
        want = {p for p, prof in scales.PROFILES.items() if scales.replays(prof, study)}
        assert want <= named, f"{nb.name}: the profile help lacks {sorted(want - named)}"
