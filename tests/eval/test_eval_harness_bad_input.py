"""evaluation/eval_harness.py's bad inputs, in tests/test_bad_input.py's style: one `error:` line,
exit 2, no traceback, every file as it was and no --out written."""
import sys

import pytest
from conftest import run_main, save_tiny_checkpoint, tiny_model
from test_bad_input import assert_error, assert_nothing_lost, snapshot

pytest.importorskip("lm_eval")

TOOL = "evaluation/eval_harness.py"
TASK = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
output_type: generate_until
test_split: test
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n"]
  {extra}
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
"""


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny checkpoint (max_seq_len 64) and two generation tasks the adapter refuses."""
    root = tmp_path_factory.mktemp("harness_bad")
    ckpt = save_tiny_checkpoint(root / "ckpt.pt", tiny_model(max_seq_len=64))
    (root / "tasks").mkdir()
    (root / "gen.jsonl").write_text('{"question": "Q: one?\\nA:", "answer": "two"}\n')
    for name, extra in [("nucleus", "top_p: 0.9\n  do_sample: true"), ("too_long", "max_gen_toks: 64")]:
        (root / "tasks" / f"{name}.yaml").write_text(TASK.format(name=name, data=root / "gen.jsonl", extra=extra))
    return root, ckpt


CASES = [  # (id, extra argv, fragments of the error line)
    ("missing_checkpoint", ["--checkpoint={root}/nope.pt", "--tasks=nucleus"], ["checkpoint not found", "nope.pt"]),
    ("unknown_task", ["--tasks=nucleuss"], ["--tasks: unknown task 'nucleuss'", "did you mean 'nucleus'"]),
    ("no_task", ["--tasks="], ["--tasks", "at least one task"]),
    ("out_over_checkpoint", ["--tasks=nucleus", "--out={ckpt}", "--force"], ["--out=", "own input"]),
    ("out_over_task_yaml", ["--tasks=nucleus", "--out={root}/tasks/nucleus.yaml", "--force"],
     ["nucleus.yaml", "never replaced"]),
    ("out_exists", ["--tasks=nucleus", "--out={root}/old.json"], ["old.json already exists", "--force"]),
    ("include_path_missing", ["--tasks=nucleus", "--include_path={root}/nowhere"], ["--include_path", "no such folder"]),
    ("limit_negative", ["--tasks=nucleus", "--limit=-1"], ["--limit", "[0, inf)"]),
    ("limit_fractional_count", ["--tasks=nucleus", "--limit=2.5"], ["--limit=2.5", "whole"]),
    ("fewshot_negative", ["--tasks=nucleus", "--num_fewshot=-1"], ["--num_fewshot", "[0, inf)"]),
    ("batch_size_zero", ["--tasks=nucleus", "--batch_size=0"], ["--batch_size"]),
    ("unsupported_generation_kwarg", ["--tasks=nucleus"], ["top_p=0.9", "not supported", "eval_harness.py"]),
    ("max_gen_toks_fills_window", ["--tasks=too_long"], ["max_gen_toks=64", "max_seq_len=64"]),
]


# a name not under --include_path reaches the harness's full task index (lm_eval.tasks.TaskManager
# reads every task YAML it ships: ~9 s); names that are all local index only that folder
INDEXED = {"unknown_task"}


@pytest.mark.parametrize("case,extra,fragments", [pytest.param(*c, marks=[pytest.mark.slow] if c[0] in INDEXED else [])
                                                  for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input(setup, case, extra, fragments):
    root, ckpt = setup
    (root / "old.json").write_text("{}\n")
    argv = [f"--checkpoint={ckpt}", f"--include_path={root}/tasks", "--bootstrap_iters=0"]
    argv = [a for a in argv if not any(e.split("=")[0] == a.split("=")[0] for e in extra)]
    argv += [e.format(root=root, ckpt=ckpt) for e in extra]
    before = snapshot(root)
    proc = run_main(TOOL, argv)
    assert_error(proc, 2, *fragments)
    assert_nothing_lost(before, snapshot(root), nothing_new=True)


def test_missing_lm_eval_names_the_install_command(setup, monkeypatch):
    root, ckpt = setup
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # `import lm_eval` now raises ImportError
    before = snapshot(root)
    proc = run_main(TOOL, [f"--checkpoint={ckpt}", "--tasks=hellaswag", f"--out={root}/new.json"])
    assert_error(proc, 2, "lm-evaluation-harness is not installed", "pip install -r requirements-eval.txt")
    assert_nothing_lost(before, snapshot(root), nothing_new=True)


def test_local_tasks_index_only_the_include_path(setup):
    """Every name a task (or a group of tasks) under --include_path: only that folder is indexed.
    A glob, a group with one of lm-eval's tasks, or an unknown name needs lm-eval's own index."""
    from lm_eval.tasks import TaskManager

    from tinylab.eval.harness import _resolves_within, task_manager
    root, _ = setup
    assert task_manager(str(root / "tasks"), ["nucleus", "too_long"]).all_tasks == ["nucleus", "too_long"]
    groups = root / "groups"
    groups.mkdir(exist_ok=True)
    (groups / "ours.yaml").write_text("group: ours\ntask:\n  - nucleus\n  - task: too_long\n")
    (groups / "mixed.yaml").write_text("group: mixed\ntask:\n  - nucleus\n  - hellaswag\n")
    (groups / "nested.yaml").write_text("group: nested\ntask:\n  - group: ours\n")
    index = TaskManager(include_path=[root / "tasks", groups], include_defaults=False).task_index
    assert [_resolves_within(index, n) for n in ["nucleus", "ours", "nested", "mixed", "nucl*", "nucleuss"]] == [
        True, True, True, False, False, False]
