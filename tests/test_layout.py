"""The layout stays what the README says: the root holds what users run, the library is the
tinylab/ package, no import cycles, no library (or evaluation) code importing an entry script,
nothing pointing outside the repository. Imports are read with `ast`, function-level ones too."""
import ast
import glob
import os
import subprocess

from conftest import REPO

# what a user runs (plus model.py, the one model module, importable as llama2.c users expect)
ROOT_SCRIPTS = {"train.py", "tinystories.py", "grow.py", "finetune_t0.py", "sample.py", "export.py", "sweep.py",
                "plot.py"}
ROOT_LIBRARY = {"model.py"}


def project_modules():
    """{module name: path} of every project Python file outside tests/."""
    mods = {}
    for path in glob.glob(os.path.join(REPO, "**", "*.py"), recursive=True):
        rel = os.path.relpath(path, REPO)
        if rel.startswith(("tests" + os.sep, ".")) or os.sep + "." in rel:
            continue
        name = rel[:-3].replace(os.sep, ".")
        mods[name[:-len(".__init__")] if name.endswith(".__init__") else name] = rel
    return mods


def entry_scripts(mods):
    return {m for m, rel in mods.items() if rel in ROOT_SCRIPTS or rel.startswith(("evaluation" + os.sep, "bench" + os.sep,
                                                                                    "experiments" + os.sep))
            and not rel.endswith("__init__.py")}


def imports_of(rel, mods):
    """The project modules a file imports, anywhere in it."""
    tree = ast.parse(open(os.path.join(REPO, rel), encoding="utf-8").read(), rel)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for n in names:
            if n in mods:
                found.add(n)
    return found


def graph():
    mods = project_modules()
    return mods, {m: imports_of(rel, mods) - {m} for m, rel in mods.items()}


def test_root_holds_what_users_run():
    root = {f for f in os.listdir(REPO) if f.endswith(".py")}
    assert root == ROOT_SCRIPTS | ROOT_LIBRARY, sorted(root ^ (ROOT_SCRIPTS | ROOT_LIBRARY))
    assert os.path.isfile(os.path.join(REPO, "tinylab", "__init__.py"))


def test_no_import_cycles():
    mods, edges = graph()
    state, stack = {}, []

    def visit(m):  # depth-first search; a grey node met again closes a cycle
        state[m] = "grey"
        stack.append(m)
        for n in sorted(edges[m]):
            if state.get(n) == "grey":
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(n):] + [n]))
            if n not in state:
                visit(n)
        stack.pop()
        state[m] = "black"

    for m in sorted(mods):
        if m not in state:
            visit(m)


def test_library_and_evaluation_never_import_entry_scripts():
    mods, edges = graph()
    entries = entry_scripts(mods)
    for m, rel in mods.items():
        if rel.startswith(("tinylab" + os.sep, "evaluation" + os.sep)) or rel in ROOT_LIBRARY:
            bad = sorted(edges[m] & entries)
            assert not bad, f"{rel} imports the entry script(s) {bad}"
        if rel.startswith("tinylab" + os.sep):
            assert not any(n.startswith("evaluation") for n in edges[m]), f"{rel} imports evaluation/"


def test_the_graph_is_read_correctly():
    """The checks above must be able to fail: the known edges are seen."""
    mods, edges = graph()
    assert "tinylab.training.trainer" in edges["train"] and "model" in edges["tinylab.core.checkpoint"]
    assert "tinylab.training.optim" in edges["tinylab.growth.optimizer_state"] and "tinylab.training.adafactor" in edges["tinylab.training.optim"]
    assert "evaluation.eval_features" in entry_scripts(mods) and "tinylab.training.trainer" not in entry_scripts(mods)


def test_nothing_points_outside_the_repository():
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True).stdout.split()
    if not files:  # not a git checkout (a copied tree): every text file
        files = [os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, "**", "*"), recursive=True)]
    needle = "../" + "shared"
    for rel in files:
        if not rel.endswith((".py", ".md", ".sh", ".yaml", ".txt", ".toml")) or rel.startswith("tests/fixtures"):
            continue
        if not os.path.isfile(os.path.join(REPO, rel)):  # deleted in the work tree, not yet in git
            continue
        with open(os.path.join(REPO, rel), encoding="utf-8", errors="replace") as f:
            text = f.read()
        assert needle not in text, f"{rel} points to {needle}"
