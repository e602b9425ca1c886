"""No module uses another module's private names: a helper two modules need is made public in a shared module
(the style rule of the developers' guide). Checked on every module of the packages, the CLIs and the benchmarks."""
import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OWN = ("axonn", "memorization", "hpc_codegen", "eval", "recipes", "benchmarks", "data")


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
    planted.write_text("from memorization.evaluation.mia import _min_k_mean\nimport memorization.launch.sweep as sw\n"
                       "x = sw._cell_done\n_z = 1\ny = _z\n")
    try:
        found = borrowed_privates(planted)
    finally:
        planted.unlink()
    assert [f.split(": ", 1)[1] for f in found] == ["from memorization.evaluation.mia import _min_k_mean",
                                                   "memorization.launch.sweep._cell_done"]


# --------------------------------------------------------------------------- the library and the scripts' tree

LIBRARY = ("axonn", "memorization", "hpc_codegen")
SCRIPT_DIRS = ("recipes", "eval")
#: a path into the scripts' tree inside a string: ``recipes/...`` or ``eval/...`` at the start of the string or of a
#: word (``$RUN_DIR/eval/<arm>``, a run's own evaluation directory, is not one)
_SCRIPT_PATH = re.compile(r"(?<![\w$/.~-])(?:\./)?(?:%s)/" % "|".join(SCRIPT_DIRS))
#: a command shown to the reader ("python recipes/jobs/generate.py --machine ...") names the script for a person to
#: run; the library itself never runs, reads or writes it
_SHOWN_COMMAND = re.compile(r"python3? (?:\./)?(?:%s)/" % "|".join(SCRIPT_DIRS))


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring nodes of ``tree`` (module, classes, functions)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def script_paths(path: Path) -> list[str]:
    """``file:line: text`` for each place where library module ``path`` names a path into the scripts' tree
    (``recipes/``, ``eval/``): a string holding one (docstrings and commands shown to a reader aside), or a path
    built with ``/ "recipes"`` or ``/ "eval"``."""
    tree = ast.parse(path.read_text())
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            text = _SHOWN_COMMAND.sub("", node.value)
            if _SCRIPT_PATH.search(text):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.value[:80]!r}")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            for side in (node.left, node.right):
                if isinstance(side, ast.Constant) and side.value in SCRIPT_DIRS:
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}: / {side.value!r}")
    return found


def test_the_library_names_no_path_into_the_scripts_tree():
    """The library (axonn/, memorization/, hpc_codegen/) never runs, reads or writes a script of recipes/ or eval/
    by path: they are its command lines, it is theirs to call.  Its job scripts run ``python -m`` entry points and
    its templates are package data."""
    files = [p for d in LIBRARY for p in sorted((REPO / d).rglob("*.py")) if "cache" not in p.parts]
    assert len(files) > 50
    found = [hit for f in files for hit in script_paths(f)]
    assert not found, "the library names these script paths (call a library function or python -m instead):\n" + \
        "\n".join(found)


def test_the_check_sees_a_script_path():
    """The check itself: strings holding a path into recipes/ or eval/, and paths built with / "recipes", are
    reported; docstrings, commands shown to a reader and a run's own eval/ directory are not."""
    planted = REPO / "memorization" / "_script_path_probe.py"
    planted.write_text('"""Run python eval/mia.py for this."""\nimport subprocess, sys\n'
                       'subprocess.run([sys.executable, "eval/hpc_code.py"])\n'
                       'T = REPO / "recipes" / "jobs"\n'
                       'x = f"generated by recipes/sweep.py: {1}"\n'
                       'hint = "or run: python recipes/memorize.py --size 8b"\n'
                       'out = f"$RUN_DIR/eval/{T}"\n'
                       'd = {"eval": 1}\n')
    try:
        found = script_paths(planted)
    finally:
        planted.unlink()
    assert sorted(f.split(":")[1] for f in found) == ["3", "4", "5"], found
