"""The built-in multitask set for T0-style finetuning (`python finetune_t0.py --make_demo_data=DIR`).

Prompted tasks about the built-in procedural stories (synth_stories.py) and small sums, in the
mixture format of finetune_t0.py: DIR/<task>_train.jsonl, DIR/<task>_valid.jsonl with
{"inputs", "targets", "answer_choices"} records, and DIR/mixture.json.

    seen (train + valid)   hero      first paragraph; "Who is this story about?" (a name), 3 prompts
                           object    first paragraph; "What does <hero> have?" (a noun), 3 prompts
                           ending    last paragraph; "Did this story end happily or sadly?", 3 prompts
                           dialogue  any paragraph; "Does anybody speak in this text? yes or no", 3 prompts
                           addition  "What is a plus b? Choose x or y."
    held out (valid only)  friend    second paragraph; "Tell me who went along with <hero>."
                           mood      last paragraph; "In the end, do things turn out happily or sadly?"
                           speech    last paragraph; "Does someone say something in the ending? yes or no"

Each seen task has several prompts (wordings), one drawn per record, as P3 has several prompts
per dataset. The held-out tasks are prompts never trained on: mood and speech ask, in their own
words and about their own passages, for story properties the training prompts ask about (how
the story ends, whether someone speaks); friend is a new extractive question. Extractive
questions (hero, object, friend) do not list their choices, as P3's extractive-QA prompts: the
choices are the passage's word and a word of the same kind the passage does not contain. The
yes/no and happily/sadly tasks have as many examples of each answer (a model that always gives
one answer scores 50%). Stories come from the synthesizer with their own seed stream, train and
valid from different shards; valid records that repeat a training record (short paragraphs and
sums recur) are removed, so the overlap check of finetune_t0.py passes. docs/t0.md has the
measured effect of finetuning on each task.
"""
import json
import os
import random

from tinylab.core.fileio import building_dir, write_atomic
from tinylab.data import synth_stories as synth
from tinylab.t0.overlap import example_hash

SEEN = ("hero", "object", "ending", "dialogue", "addition")
HELD_OUT = ("friend", "mood", "speech")
WEIGHTS = {"hero": 1.0, "object": 1.0, "ending": 1.0, "dialogue": 1.0, "addition": 0.5}
BALANCED = ("ending", "dialogue", "mood", "speech")
NAMES = synth.GIRLS + synth.BOYS + synth.PET_NAMES
DEMO_SEED_OFFSET = 1000  # story shards of the demo never coincide with `synthesize`'s (seed 0..)


def _options(rng, answer, pool, exclude_text, k=2):
    """`answer` and k - 1 distractors from `pool` that do not occur in `exclude_text`, shuffled."""
    others = [w for w in pool if w != answer and f" {w}" not in f" {exclude_text}"]
    opts = [answer] + rng.sample(others, k - 1)
    rng.shuffle(opts)
    return opts


PROMPTS = {
    "hero": ["Who is this story about?", "Who is the main character?", "Name the hero of this story."],
    "object": ["What does {hero} have?", "Which thing belongs to {hero}?", "What is {hero}'s special thing?"],
    "ending": ["Did this story end happily or sadly?", "How did it end, happily or sadly?",
               "Happily or sadly: how does the story end?"],
    "dialogue": ["Is anyone talking out loud in this part of the story? yes or no",
                 "Does anybody speak in this text? yes or no", "Are there spoken words in this passage? yes or no"],
}


def _words(text):
    """The text with punctuation blanked and spaces around, for whole-word tests f" {w} " in ..."""
    return f" {text.replace(',', ' ').replace('.', ' ').replace('!', ' ').replace('?', ' ')} "


def _first(text, words):
    """The word of `words` that occurs first in text (whole words), or None."""
    hits = [(text.find(w), w) for w in words if f" {w} " in _words(text)]
    return min(hits)[1] if hits else None


def _record(inputs, target, choices):
    assert target in choices
    return {"inputs": inputs, "targets": target, "answer_choices": choices}


def _extract(rng, passage, question, answer, pool):
    """An extractive question: the passage's word `answer` vs one of `pool` it does not contain."""
    if answer is None or f" {answer} " not in _words(passage):
        return None
    return _record(f"{passage}\n{question}", answer, _options(rng, answer, pool, passage))


def story_task(task, story, rng):
    """One record of a story task, or None when this story cannot ask it."""
    paras = [p.strip() for p in story["story"].strip().split("\n\n") if p.strip()]
    if len(paras) < 3:
        return None
    p1, p2, last = paras[0], paras[1], paras[-1]
    hero = _first(p1, NAMES)
    verb, noun, adj = story["instruction"]["words"]
    if hero is None:
        return None
    others = [n for n in NAMES if n != hero]
    # seen tasks have several prompts each (P3 has several per dataset), one drawn per record
    if task == "hero":
        return _extract(rng, p1, rng.choice(PROMPTS["hero"]), hero, NAMES)
    if task == "object":
        return _extract(rng, p1, rng.choice(PROMPTS["object"]).format(hero=hero), noun, synth.NOUNS)
    if task == "ending":
        answer = "sadly" if "BadEnding" in story["instruction"]["features"] else "happily"
        return _record(f"{last}\n{rng.choice(PROMPTS['ending'])}", answer, ["happily", "sadly"])
    if task == "dialogue":
        para = rng.choice(paras)
        answer = "yes" if '"' in para else "no"
        return _record(f"{para}\n{rng.choice(PROMPTS['dialogue'])}", answer, ["yes", "no"])
    if task == "friend":
        return _extract(rng, p2, f"Tell me who went along with {hero}.", _first(p2, others), others)
    if task == "mood":
        answer = "sadly" if "BadEnding" in story["instruction"]["features"] else "happily"
        return _record(f"{last}\nIn the end, do things turn out happily or sadly?", answer, ["happily", "sadly"])
    if task == "speech":
        answer = "yes" if '"' in last else "no"
        return _record(f"{last}\nDoes someone say something in the ending? yes or no", answer, ["yes", "no"])
    raise ValueError(task)


def addition_task(rng):
    a, b = rng.randint(0, 20), rng.randint(0, 20)
    wrong = a + b + rng.choice([-3, -2, -1, 1, 2, 3])
    if wrong < 0:
        wrong = a + b + 1
    opts = [str(a + b), str(wrong)]
    rng.shuffle(opts)
    return _record(f"What is {a} plus {b}? Choose {opts[0]} or {opts[1]}.", str(a + b), opts)


def make_records(task, n, seed, split):
    """n records of `task` for `split` ("train" / "valid"), from the split's own story shards."""
    rng = random.Random(f"{seed}/{task}/{split}")
    if task == "addition":
        return [addition_task(rng) for _ in range(n)]
    shard = DEMO_SEED_OFFSET + (0 if split == "train" else 1) * 100 + (SEEN + HELD_OUT).index(task)
    stories = synth.generate_shard(seed + DEMO_SEED_OFFSET, shard, 6 * n)
    out, per_answer = [], {}
    for story in stories:
        rec = story_task(task, story, rng)
        if rec is None:
            continue
        # fixed-label tasks keep their answers balanced: a constant guess scores 1 / #choices
        if task in BALANCED:
            if per_answer.get(rec["targets"], 0) >= n // len(rec["answer_choices"]):
                continue
            per_answer[rec["targets"]] = per_answer.get(rec["targets"], 0) + 1
        out.append(rec)
        if len(out) == n:
            break
    return out


def write_jsonl(path, records):
    write_atomic(path, "".join(json.dumps(r) + "\n" for r in records).encode())


def write_demo_data(out_dir, seed=0, n_train=1500, n_valid=200):
    """Write the task files and mixture.json into `out_dir`, built in a temp folder beside it and
    renamed when complete (replacing an older one); returns the mixture dict."""
    mixture = {"train": [], "valid": []}
    train_hashes = set()
    with building_dir(out_dir) as tmp:
        for task in SEEN:
            records = make_records(task, n_train, seed, "train")
            train_hashes |= {example_hash(r["inputs"], r["targets"]) for r in records}
            write_jsonl(os.path.join(tmp, f"{task}_train.jsonl"), records)
            mixture["train"].append({"name": task, "path": f"{task}_train.jsonl", "weight": WEIGHTS[task]})
        for task in SEEN + HELD_OUT:
            records = [r for r in make_records(task, n_valid, seed, "valid")
                       if example_hash(r["inputs"], r["targets"]) not in train_hashes]
            write_jsonl(os.path.join(tmp, f"{task}_valid.jsonl"), records)
            mixture["valid"].append({"name": task, "path": f"{task}_valid.jsonl"})
        write_atomic(os.path.join(tmp, "mixture.json"), json.dumps(mixture, indent=1).encode())
    return mixture
