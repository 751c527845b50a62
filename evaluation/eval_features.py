"""How often a model's stories contain a feature they were asked for: the fine-tuning study's
"generation score" (../shared/spec/tinystories-data.md §13).

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


from tinylab.dataset_spec import FEATURES  # noqa: E402
from tinylab.errors import UserError, cli_main  # noqa: E402
from tinylab.eval_common import (
    cache_dir_of,
    check_positive,
    emit,
    layout_vocab,
    load_for_args,
    model_parser,
    write_atomic,
)
from tinylab.feature_judge import (
    EXAMPLES,
    QUESTIONS,
    FeatureScore,
    asks_for,
    check_feature,
    generate_rows,
    make_judge,
    wilson_ci,
)

# ---------------------------------------------------------------------- the offline classifier


# ---------------------------------------------------------------------- the LLM judge

assert set(QUESTIONS) == set(EXAMPLES) == set(FEATURES)


# ---------------------------------------------------------------------- scoring generations


def main(argv=None):
    p = model_parser(__doc__)
    p.add_argument("--feature", default="Twist", help=f"one of {', '.join(FEATURES)}")
    p.add_argument("--prompts_from", required=True, help="pretokenized dataset whose test headers are the prompts")
    p.add_argument("--num_samples", type=int, default=64)
    p.add_argument("--max_new_tokens", type=int, default=350)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top_k", type=int, default=0, help="0 = no top-k filtering")
    p.add_argument("--judge", default="classifier", choices=["classifier", "llm"])
    p.add_argument("--judge_url", default="", help="llm judge: base URL of an OpenAI-compatible API (…/v1)")
    p.add_argument("--judge_model", default="gpt-3.5-turbo")
    p.add_argument("--judge_timeout", type=float, default=30.0, help="seconds per request before giving up")
    p.add_argument("--judge_cache", default="", help="llm judge: JSONL file of cached replies")
    p.add_argument("--generations_out", default="", help="also write each prompt, story and verdict (JSONL)")
    from tinylab.pretokenized import check_dataset
    a = p.parse_args(argv)
    # every input is checked before the expensive work: loading the model, training the classifier,
    # generating the stories
    check_feature(a.feature)
    check_positive(num_samples=a.num_samples, batch_size=a.batch_size, max_new_tokens=a.max_new_tokens)
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
