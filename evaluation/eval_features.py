"""How often a model's stories contain a feature they were asked for: the fine-tuning study's
"generation score" (docs/evaluation.md).

    python evaluation/eval_features.py --checkpoint=out/ckpt.pt --feature=Twist --prompts_from=filter-adv-Twist
    python evaluation/eval_features.py ... --judge=llm --judge_url=http://127.0.0.1:8000/v1 --judge_model=gpt-3.5-turbo
    python evaluation/eval_features.py --tables=out/run --feature=Twist         # a run's logged generations
    python evaluation/eval_features.py --tables=ENTITY/PROJECT/RUN_ID --feature=Twist --judge=llm ...   # a wandb run

Prompts are the instruction headers (up to `Story:`) of BOS-aligned test examples of the
pretokenized dataset --prompts_from (the adversarial dataset asks for the feature in every prompt);
the model writes a story for each (temperature 1, as the training-time generation eval), a judge
says whether it has the feature, and the score is the fraction of stories that do among the
prompts that asked for it, with a 95% Wilson interval.

Judges (the one in use is named in every output):
  classifier  (default, offline) logistic regression on word unigram + bigram presence in the story,
              trained on raw stories of the data cache's train shards (1..) labelled by their own
              `instruction.features` field; its accuracy on stories of the test shard (0) is
              reported as judge_accuracy. Cached in <data_cache_dir>/judges/.
  llm         an OpenAI-compatible chat completions API with the study's protocol: system role
              "helpful assistant answering questions about children's stories", two examples
              (2-shot), reasoning in <reasoning> tags and the answer in <answer> tags,
              temperature 0, max_tokens 200; an answer containing "yes" counts 1, "no" 0, anything
              else 0 with a warning. Answers are cached by a hash of model + prompt
              (--judge_cache=FILE keeps them across runs). judge_accuracy is null (unmeasured).
              --judge_url is probed (one HEAD request) before any story is generated.
--tables scores the generations a training run already logged instead of generating new ones
(tinylab/eval/run_tables.py): every evaluation's tables (all datasets pooled, and per dataset), with
the same judge and the same rule (only prompts that ask for the feature), written back to the run
as one record per evaluation: to its metrics.jsonl (`kind: "feature_score"`, appended atomically)
or, for a wandb run path, to that wandb run (resumed; `iter_num_gen` is the iteration), as the
study's wandb_generation_classification.py did. --checkpoint is not used then.
Last stdout line: {"feature", "score", "ci95", "n", "judge", "judge_accuracy"} (with --tables: of
the last evaluation, plus "iter", "tables" and "per_iter").
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tinylab.core.config import Key
from tinylab.core.errors import UserError, cli_main
from tinylab.core.fileio import write_atomic
from tinylab.core.memory_budget import check_generation
from tinylab.data.pretokenized import check_dataset
from tinylab.data.records import FEATURES
from tinylab.eval.common import cache_dir_of, emit, layout_vocab, load_for_args
from tinylab.eval.feature_judge import FeatureScore, asks_for, make_judge, wilson_ci
from tinylab.eval.lm_eval import MAX_NEW_TOKENS, TEMPERATURE, TOP_K, generate_rows
from tinylab.eval.run_tables import open_run
from tinylab.schema import EVAL

SCHEMA = EVAL.derive("evaluation/eval_features.py", sections=[("feature score", [
    Key("feature", "Twist", "the feature asked for and judged", choices=FEATURES),
    Key("prompts_from", None, "pretokenized dataset whose test headers are the prompts (or --tables)", type=str,
        nonempty=True),
    Key("tables", None, "instead: score the generations a run logged: its metrics.jsonl (or run folder), or a wandb "
        "run ENTITY/PROJECT/RUN_ID; the score is written back to it", type=str, nonempty=True, input=True),
    Key("metric_name", "gen_feature_score", "--tables: the name of the score written back (per dataset: "
        "<name>/<dataset>)", nonempty=True),
    Key("num_samples", 64, "stories generated", range="[1, inf)"),
    MAX_NEW_TOKENS.replace(range="[1, inf)", help="tokens generated per story"), TEMPERATURE, TOP_K,
    Key("judge", "classifier", "classifier (offline, trained on the corpus's labels) | llm (an OpenAI-compatible "
        "API)", choices=("classifier", "llm")),
    Key("judge_url", "", "llm judge: base URL of an OpenAI-compatible API (.../v1)"),
    Key("judge_model", "gpt-3.5-turbo", "llm judge: model name"),
    Key("judge_timeout", 30.0, "llm judge: seconds per request before giving up", range="(0, inf)"),
    Key("judge_cache", "", "llm judge: JSONL file of cached replies (read, then appended to)", output="jsonl_cache"),
    Key("generations_out", "", "also write each prompt, story and verdict (JSONL; an existing file only with --force)",
        output="jsonl"),
])])


def main(argv=None):
    a = SCHEMA.parse_args(argv, SCHEMA.argparser(__doc__.split("\n\n")[0]))
    if (a.prompts_from is None) == (a.tables is None):
        raise UserError("give --prompts_from=DATASET (generate stories) or --tables=RUN (score the logged ones)"
                        if a.tables is None else "--prompts_from and --tables both name the stories; pass one of them")
    # every input is checked before the expensive work: loading the model, training the classifier,
    # generating the stories
    llm = None
    if a.judge == "llm":  # the URL's form, the timeout and the cache file
        llm = make_judge(a.feature, "", "llm", a.judge_url, a.judge_model, a.judge_timeout, a.judge_cache)
    if a.tables is not None:
        return score_tables(a, llm)
    model, ckpt, tok = load_for_args(a)
    cache = cache_dir_of(ckpt, a.data_cache_dir)
    check_dataset(cache, layout_vocab(ckpt, tok), a.prompts_from, tok.model_path)
    if llm:
        llm.check_reachable()  # a dead --judge_url fails now, not after every story is generated
    # batch_size windows and generations of up to max_new_tokens, num_samples prompts: before the work
    check_generation(model, min(a.batch_size, a.num_samples), 1, a.max_new_tokens,
                     {"rows": "--batch_size", "new": "--max_new_tokens", "prompts": "--num_samples"},
                     prompts=a.num_samples, windows=a.batch_size)
    judge = llm or make_judge(a.feature, cache)  # the classifier: trained (and cached) on first use
    rows = generate_rows(model, tok, ckpt, cache, a.prompts_from, a.num_samples, a.batch_size, a.max_new_tokens,
                         a.temperature, a.top_k, a.seed)
    scorer = FeatureScore(judge)
    present = scorer.add("prompts", rows)
    if not present:
        raise UserError(f"none of the {len(rows)} prompts of {a.prompts_from} asks for {a.feature}; use a dataset "
                        f"whose headers request it (e.g. filter-adv-{a.feature} or recovery-{a.feature})")
    metrics = score_metrics(a.feature, present, judge)
    write_generations(a, rows, present)
    report_judge(judge)
    print(f"{len(rows)} stories generated for prompts of {a.prompts_from}; {metrics['n']} prompts asked for {a.feature}")
    report_score(a.feature, metrics)
    emit(metrics, a.out)


def score_metrics(feature, present, judge):
    k, n = sum(present), len(present)
    return {"feature": feature, "score": k / n, "ci95": wilson_ci(k, n), "n": n, "judge": judge.name,
            "judge_accuracy": judge.accuracy}


def write_generations(a, rows, present):
    if a.generations_out:
        asked = [r for r in rows if asks_for(r[0], a.feature)]
        lines = [json.dumps({"prompt": r[1], "generation": r[2], "target": r[3], "has_feature": v, "iter": r[4]})
                 for r, v in zip(asked, present)]
        os.makedirs(os.path.dirname(os.path.abspath(a.generations_out)), exist_ok=True)  # as --out does
        write_atomic(a.generations_out, ("\n".join(lines) + "\n").encode())


def report_judge(judge):
    print(f"judge: {judge.description}")
    if judge.accuracy is not None and judge.accuracy < 0.9:
        print(f"warning: the judge's held-out accuracy {judge.accuracy:.3f} is below 0.9; scores are rough")


def report_score(feature, m, where=""):
    lo, hi = m["ci95"]
    k = round(m["score"] * m["n"])
    print(f"{where}{feature} present in {k}/{m['n']} = {m['score']:.3f} of them (95% CI {lo:.3f}-{hi:.3f})")


def score_tables(a, llm):
    """--tables: judge every logged evaluation's generations and write the scores back to the run."""
    run = open_run(a.tables)
    iters = sorted(run.tables, key=lambda it: (it is None, it))
    if not any(asks_for(r[0], a.feature) for it in iters for rows in run.tables[it].values() for r in rows):
        raise UserError(f"none of the logged prompts of {run.where} asks for {a.feature}; score a feature the "
                        f"generation datasets request (e.g. a run with eval_dataset_names=['filter-adv-{a.feature}'])")
    cache = a.data_cache_dir or run.config.get("data_cache_dir") or "data"
    judge = llm or make_judge(a.feature, cache)
    if llm:
        llm.check_reachable()
    scorer, name = FeatureScore(judge), a.metric_name
    records, per_iter, all_rows, all_present = [], [], [], []
    for it in iters:
        present = []
        for dataset, rows in sorted(run.tables[it].items()):
            present += scorer.add(dataset, rows)
            all_rows += [r[:4] + [it] for r in rows]
        all_present += present
        if not present:  # no prompt of this evaluation asked for the feature
            scorer.metrics()
            continue
        m = score_metrics(a.feature, present, judge)
        # FeatureScore's keys (train.py's feature_eval) under --metric_name
        scores = {k.replace("gen_feature_score", name, 1): v for k, v in scorer.metrics().items()}
        records.append({"iter": it, "feature": a.feature, **scores, f"{name}_ci95": m["ci95"], f"{name}_n": m["n"],
                        "tables": run.where})
        per_iter.append({"iter": it, **{k: m[k] for k in ("score", "ci95", "n")}})
        report_score(a.feature, m, f"iter {it}: ")
    write_generations(a, all_rows, all_present)
    report_judge(judge)
    run.write(records)
    last = per_iter[-1]
    emit({"feature": a.feature, **{k: last[k] for k in ("score", "ci95", "n")}, "judge": judge.name,
          "judge_accuracy": judge.accuracy, "iter": last["iter"], "tables": a.tables, "per_iter": per_iter}, a.out)


if __name__ == "__main__":
    cli_main(main)
