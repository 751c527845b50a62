"""The layout stays what the README says: the root holds what users run, the library is the
tinylab/ package, no import cycles, no library (or evaluation) code importing an entry script,
nothing pointing outside the repository. Imports are read with `ast`, function-level ones too."""
import ast
import glob
import os
import re
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


# ---------------------------------------------------------------------- the library's layers and sizes

# a folder of tinylab/ may import only the folders before it (model.py sits between nn and core):
# nn holds the model's building blocks, eval sits on top of everything it evaluates
LAYERS = ("nn", "model", "core", "interop", "data", "training", "growth", "t0", "eval")
MAX_MODULE_LINES, MAX_FUNCTION_LINES, MAX_MODEL_LINES = 600, 60, 500
# modules that import nothing of the project but each other, so any layer may use them (the
# registry, UserError)
FOUNDATIONS = {"tinylab.core.registry", "tinylab.core.errors"}


def layer_of(module: str):
    """tinylab.<folder>.x -> folder, model -> model; None for tinylab/__init__ and tinylab/schema.py
    (the programs' key sets: above every layer, imported by entry scripts and tests only)."""
    if module == "model":
        return "model"
    parts = module.split(".")
    return parts[1] if parts[0] == "tinylab" and len(parts) > 2 and parts[1] in LAYERS else None


def layer_violations(edges):
    bad = [f"{m} imports {sorted(edges[m] - FOUNDATIONS)} (a module every layer uses imports nothing else)"
           for m in sorted(FOUNDATIONS) if edges.get(m, set()) - FOUNDATIONS]
    for m, targets in sorted(edges.items()):
        own = layer_of(m)
        for t in sorted(targets):
            if own is not None and t == "tinylab.schema":
                bad.append(f"{m} -> {t} (library code never imports the programs' key sets)")
            other = layer_of(t)
            if t in FOUNDATIONS:
                continue
            if own is not None and other is not None and other != own and LAYERS.index(other) > LAYERS.index(own):
                bad.append(f"{m} -> {t} ({own} may not import {other})")
    return bad


def long_functions(text, name, limit=MAX_FUNCTION_LINES):
    """Functions and methods of `text` longer than `limit` lines, from `def` to their last line."""
    return [f"{name}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines"
            for node in ast.walk(ast.parse(text, name)) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > limit]


PRIVATE_TORCH = re.compile(r"torch\.ops\.(mkldnn|aten|quantized|prims|_\w+)\b|torch\._C\b|_reorder_linear_weight|"
                           r"_linear_pointwise")


def private_torch_uses(text, name):
    return [f"{name}:{i}: {line.strip()}" for i, line in enumerate(text.splitlines(), 1) if PRIVATE_TORCH.search(line)]


def library_files():
    return sorted(glob.glob(os.path.join(REPO, "tinylab", "**", "*.py"), recursive=True)) + [os.path.join(REPO, "model.py")]


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def test_folders_import_only_the_layers_below_them():
    _, edges = graph()
    bad = layer_violations(edges)
    assert not bad, "\n".join(bad)


def test_modules_and_functions_stay_readable():
    long_modules, long_defs = [], []
    for path in library_files():
        text, rel = read(path), os.path.relpath(path, REPO)
        if text.count("\n") > MAX_MODULE_LINES:
            long_modules.append(f"{rel}: {text.count(chr(10))} lines")
        long_defs += long_functions(text, rel)
    assert not long_modules, f"modules over {MAX_MODULE_LINES} lines: {long_modules}"
    assert not long_defs, f"functions over {MAX_FUNCTION_LINES} lines: {long_defs}"
    model_lines = read(os.path.join(REPO, "model.py")).count("\n")
    assert model_lines <= MAX_MODEL_LINES, f"model.py is the architecture and generate only ({model_lines} lines)"


def test_no_private_torch_ops():
    """One code path on every device: nothing undocumented (torch.ops.mkldnn.*, torch._C)."""
    paths = library_files() + [p for d in ("", "evaluation", "bench", "experiments", "dataset_gen")
                               for p in sorted(glob.glob(os.path.join(REPO, d, "*.py")))]
    found = [use for p in paths for use in private_torch_uses(read(p), os.path.relpath(p, REPO))]
    assert not found, "private torch ops:\n" + "\n".join(found)


def test_the_layout_rules_can_fail():
    """Each rule above sees a violation when there is one."""
    assert layer_of("tinylab.eval.common") == "eval" and layer_of("tinylab.schema") is None
    assert layer_violations({"tinylab.nn.sampling": {"model"}, "tinylab.core.checkpoint": {"model"},
                             "tinylab.t0.batches": {"tinylab.schema"}, "tinylab.nn.fused_head": {"tinylab.core.errors"},
                             "tinylab.core.errors": set()}) == [
        "tinylab.nn.sampling -> model (nn may not import model)",
        "tinylab.t0.batches -> tinylab.schema (library code never imports the programs' key sets)"]
    assert layer_violations({"tinylab.nn.x": {"tinylab.core.registry"}, "tinylab.core.registry": {"tinylab.core.config"}}) == [
        "tinylab.core.registry imports ['tinylab.core.config'] (a module every layer uses imports nothing else)"]
    body = "def f():\n" + "    x = 1\n" * MAX_FUNCTION_LINES
    assert long_functions(body, "a.py") == [f"a.py:1 f: {MAX_FUNCTION_LINES + 1} lines"]
    assert long_functions("def g():\n    pass\n", "b.py") == []
    assert private_torch_uses("w = torch.ops.mkldnn._reorder_linear_weight(w)\ny = torch.mm(a, b)\n", "c.py") == [
        "c.py:1: w = torch.ops.mkldnn._reorder_linear_weight(w)"]
