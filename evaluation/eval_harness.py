"""lm-evaluation-harness tasks on our checkpoint, directly (docs/evaluation.md, "lm-evaluation-harness").

    python evaluation/eval_harness.py --checkpoint=out/ckpt.pt --tasks=lambada_openai,hellaswag --out=harness.json
    python evaluation/eval_harness.py --checkpoint=out/ckpt.pt --tasks=copa,rte,cb,wic --num_fewshot=0 --limit=100
    python evaluation/eval_harness.py --checkpoint=out/ckpt.pt --tasks=my_task --include_path=my_tasks/

The model and the checkpoint's own sentencepiece tokenizer run behind the harness's LM interface
(tinylab/eval/harness.py): loglikelihood, rolling loglikelihood (perplexity tasks) and
generate_until, batched, with BOS in front of every context as the model was trained. The
numbers are those of `lm_eval --model hf` on the checkpoint's HF export (the docs give both
commands and the measured agreement). Needs lm-eval: pip install -r requirements-eval.txt.

Prints the harness's table; the last stdout line is the harness's results JSON (per-task
metrics, task configs, versions, n-shot, sample counts; no per-sample records), the same object
--out writes.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tinylab.core.config import Key
from tinylab.core.errors import UserError, cli_main
from tinylab.core.memory_budget import check_model_batch
from tinylab.eval.common import emit, load_for_args
from tinylab.eval.harness import (
    check_generation_settings,
    check_tasks,
    evaluate,
    harness_lm,
    load_tasks,
    require_lm_eval,
    results_table,
    task_manager,
)
from tinylab.eval.keys import EVAL_KEYS
from tinylab.schema import EVAL

SEED = next(k for k in EVAL_KEYS if k.name == "seed")
SCHEMA = EVAL.derive("evaluation/eval_harness.py", keys=[
    SEED.replace(default=1234, help="every seed of the harness's (few-shot examples, sampling), as lm_eval --seed N"),
], sections=[("lm-evaluation-harness", [
    Key("tasks", [], "harness tasks, groups or tags, comma-separated (globs allowed): lambada_openai,hellaswag",
        required=True),
    Key("include_path", "", "a folder of your own task YAMLs, added to the harness's tasks", input=True),
    Key("num_fewshot", None, "few-shot examples per prompt (default: each task's own)", type=int, range="[0, inf)"),
    Key("limit", 0.0, "only the first N documents of each task (N < 1: that fraction of them); 0 = all",
        range="[0, inf)"),
    Key("bootstrap_iters", 100000, "bootstrap resamples for the stderr of non-mean metrics (0 = none)",
        range="[0, inf)"),
])])


def main(argv=None):
    a = SCHEMA.parse_args(sys.argv[1:] if argv is None else list(argv), SCHEMA.argparser(__doc__.split("\n\n")[0]))
    if not a.tasks:
        raise UserError("--tasks: give at least one task name")
    if a.limit >= 1 and a.limit != int(a.limit):
        raise UserError(f"--limit={a.limit:g}: a count of documents must be whole (or a fraction below 1)")
    if not os.path.exists(a.checkpoint):
        raise UserError(f"checkpoint not found: {a.checkpoint}")
    if a.include_path and not os.path.isdir(a.include_path):
        raise UserError(f"--include_path={a.include_path}: no such folder")
    require_lm_eval()  # before the model is loaded: a missing harness is one line, at once
    manager = task_manager(a.include_path, a.tasks)
    names = check_tasks(manager, a.tasks)
    model, ckpt, tok = load_for_args(a)
    check_model_batch(model, a.batch_size, model.params.max_seq_len, "--batch_size")
    tasks, by_name = load_tasks(manager, names)
    check_generation_settings(by_name, model.params.max_seq_len)
    lm = harness_lm(model, tok, batch_size=a.batch_size, seed=a.seed)
    limit = None if a.limit == 0 else (int(a.limit) if a.limit >= 1 else a.limit)
    results = evaluate(lm, manager, tasks, a.num_fewshot, limit, a.seed, a.bootstrap_iters)
    results = {k: v for k, v in results.items() if k != "samples"}
    results["config"] = {**results.get("config", {}), "model": "tinylab",
                         "model_args": f"checkpoint={a.checkpoint}", "batch_size": a.batch_size}
    print(f"model {a.checkpoint}: {model.num_params():,} parameters, max_seq_len {model.params.max_seq_len}, "
          f"tokenizer {tok.model_path}")
    print(results_table(results))
    emit(json_safe(results), a.out)


def json_safe(obj):
    """The results as plain JSON values (the harness's own encoder for what json cannot write)."""
    import json

    from lm_eval.utils import handle_non_serializable
    return json.loads(json.dumps(obj, default=handle_non_serializable))


if __name__ == "__main__":
    cli_main(main)
