"""No module uses another module's private names: a helper two modules need is made public in a shared module
(the style rule of the developers' guide). Checked on every module of the packages, the CLIs and the benchmarks."""
import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OWN = ("axonn", "memorization", "eval", "recipes", "benchmarks", "data")


def _module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def _absolute(module: str | None, level: int, here: str, is_package: bool) -> str:
    if level == 0:
        return module or ""
    base = here.split(".") if is_package else here.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def borrowed_privates(path: Path) -> list[str]:
    """``module:line: name`` for each private name of another of our modules that ``path`` imports or reads as
    an attribute of an imported module."""
    here = _module_name(path)
    tree = ast.parse(path.read_text())
    modules: dict[str, str] = {}  # local name -> our module it is bound to
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in OWN:
                    modules[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            src = _absolute(node.module, node.level, here, path.name == "__init__.py")
            if src.split(".")[0] not in OWN or src == here:
                continue
            for a in node.names:
                if _private(a.name):
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}: from {src} import {a.name}")
                elif (REPO / Path(*src.split("."), a.name)).with_suffix(".py").exists():
                    modules[a.asname or a.name] = f"{src}.{a.name}"
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and _private(node.attr) and isinstance(node.value, ast.Name)
                and node.value.id in modules and modules[node.value.id] != here):
            found.append(f"{path.relative_to(REPO)}:{node.lineno}: {modules[node.value.id]}.{node.attr}")
    return found


def test_no_module_borrows_another_modules_private_names():
    files = [p for d in OWN for p in sorted((REPO / d).rglob("*.py")) if "cache" not in p.parts]
    assert len(files) > 50
    found = [hit for f in files for hit in borrowed_privates(f)]
    assert not found, "make these helpers public in a shared module:\n" + "\n".join(found)


def test_the_check_sees_a_borrowed_private_name(tmp_path):
    """The check itself: a planted module importing another's private helper, or reading one through the module,
    is reported (and the module's own private names are not)."""
    planted = REPO / "memorization" / "_boundary_probe.py"
    planted.write_text("from memorization.mia import _min_k_mean\nimport memorization.sweep as sw\n"
                       "x = sw._cell_done\n_z = 1\ny = _z\n")
    try:
        found = borrowed_privates(planted)
    finally:
        planted.unlink()
    assert [f.split(": ", 1)[1] for f in found] == ["from memorization.mia import _min_k_mean",
                                                   "memorization.sweep._cell_done"]
