"""How often a model's stories contain a feature they were asked for: the fine-tuning study's
"generation score" (docs/evaluation.md).

    python evaluation/eval_features.py --checkpoint=out/ckpt.pt --feature=Twist --prompts_from=filter-adv-Twist
    python evaluation/eval_features.py ... --judge=llm --judge_url=http://127.0.0.1:8000/v1 --judge_model=gpt-3.5-turbo

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
Last stdout line: {"feature", "score", "ci95", "n", "judge", "judge_accuracy"}.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tinylab.config import Key
from tinylab.dataset_spec import FEATURES
from tinylab.errors import UserError, cli_main
from tinylab.eval_common import cache_dir_of, emit, layout_vocab, load_for_args
from tinylab.feature_judge import FeatureScore, asks_for, make_judge, wilson_ci
from tinylab.fileio import write_atomic
from tinylab.lm_eval import generate_rows
from tinylab.pretokenized import check_dataset
from tinylab.schema import EVAL, MAX_NEW_TOKENS, TEMPERATURE, TOP_K

SCHEMA = EVAL.derive("evaluation/eval_features.py", sections=[("feature score", [
    Key("feature", "Twist", "the feature asked for and judged", choices=FEATURES),
    Key("prompts_from", None, "pretokenized dataset whose test headers are the prompts", type=str, required=True,
        nonempty=True),
    Key("num_samples", 64, "stories generated", range="[1, inf)"),
    MAX_NEW_TOKENS.replace(range="[1, inf)", help="tokens generated per story"), TEMPERATURE, TOP_K,
    Key("judge", "classifier", "classifier (offline, trained on the corpus's labels) | llm (an OpenAI-compatible "
        "API)", choices=("classifier", "llm")),
    Key("judge_url", "", "llm judge: base URL of an OpenAI-compatible API (.../v1)"),
    Key("judge_model", "gpt-3.5-turbo", "llm judge: model name"),
    Key("judge_timeout", 30.0, "llm judge: seconds per request before giving up", range="(0, inf)"),
    Key("judge_cache", "", "llm judge: JSONL file of cached replies"),
    Key("generations_out", "", "also write each prompt, story and verdict (JSONL)"),
])])


def main(argv=None):
    a = SCHEMA.parse_args(argv, SCHEMA.argparser(__doc__.split("\n\n")[0]))
    # every input is checked before the expensive work: loading the model, training the classifier,
    # generating the stories
    llm = None
    if a.judge == "llm":  # the URL's form, the timeout and the cache file
        llm = make_judge(a.feature, "", "llm", a.judge_url, a.judge_model, a.judge_timeout, a.judge_cache)
    model, ckpt, tok = load_for_args(a)
    cache = cache_dir_of(ckpt, a.data_cache_dir)
    check_dataset(cache, layout_vocab(ckpt, tok), a.prompts_from, tok.model_path)
    if llm:
        llm.check_reachable()  # a dead --judge_url fails now, not after every story is generated
    judge = llm or make_judge(a.feature, cache)  # the classifier: trained (and cached) on first use
    rows = generate_rows(model, tok, ckpt, cache, a.prompts_from, a.num_samples, a.batch_size, a.max_new_tokens,
                         a.temperature, a.top_k, a.seed)
    scorer = FeatureScore(judge)
    present = scorer.add("prompts", rows)
    if not present:
        raise UserError(f"none of the {len(rows)} prompts of {a.prompts_from} asks for {a.feature}; use a dataset "
                        f"whose headers request it (e.g. filter-adv-{a.feature} or recovery-{a.feature})")
    k, n = sum(present), len(present)
    metrics = {"feature": a.feature, "score": k / n, "ci95": wilson_ci(k, n), "n": n, "judge": judge.name,
               "judge_accuracy": judge.accuracy}
    if a.generations_out:
        asked = [r for r in rows if asks_for(r[0], a.feature)]
        lines = [json.dumps({"prompt": r[1], "generation": r[2], "target": r[3], "has_feature": v})
                 for r, v in zip(asked, present)]
        os.makedirs(os.path.dirname(os.path.abspath(a.generations_out)), exist_ok=True)  # as --out does
        write_atomic(a.generations_out, ("\n".join(lines) + "\n").encode())
    print(f"judge: {judge.description}")
    if judge.accuracy is not None and judge.accuracy < 0.9:
        print(f"warning: the judge's held-out accuracy {judge.accuracy:.3f} is below 0.9; scores are rough")
    print(f"{len(rows)} stories generated for prompts of {a.prompts_from}; {n} prompts asked for {a.feature}")
    print(f"{a.feature} present in {k}/{n} = {k / n:.3f} of them (95% CI {metrics['ci95'][0]:.3f}-{metrics['ci95'][1]:.3f})")
    emit(metrics, a.out)


if __name__ == "__main__":
    cli_main(main)
