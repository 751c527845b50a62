"""Feature-presence judges for generated stories: does a story have a Twist (Dialogue, ...)? The
fine-tuning study's "generation score" (docs/evaluation.md).

  ClassifierJudge  offline: logistic regression on word unigram + bigram presence, trained on the
                   raw stories of the data cache's train shards labelled by their own
                   `instruction.features`, measured on the test shard (cached in <cache>/judges/)
  LLMJudge         an OpenAI-compatible chat API with the study's 2-shot protocol (answers cached)
  FeatureScore     pools the verdicts over the prompts that asked for the feature
Used by evaluation/eval_features.py and by train.py's feature_eval during training.
"""
import glob
import hashlib
import json
import math
import os
import random
import re
import time
from collections import Counter

import torch

from tinylab.core.errors import UserError, first_line
from tinylab.core.progress import progress
from tinylab.data.records import FEATURES, STORY_FEATURES, load_raw_shard, raw_data_dir
from tinylab.data.records import check_feature as _check_feature
from tinylab.data.template import feature_labels, header_fields
from tinylab.eval.common import write_atomic


def check_feature(name: str, flag="--feature") -> str:
    _check_feature(flag, name)
    return name


def wilson_ci(k: int, n: int, z: float = 1.96):
    """95% Wilson score interval of a binomial proportion k/n (sensible at 0/n and n/n too)."""
    if n == 0:
        return [0.0, 1.0]
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [max(0.0, centre - half), min(1.0, centre + half)]


def asks_for(prompt_text: str, feature: str) -> bool:
    """Does an instruction header's Features line request `feature`?"""
    value = header_fields(prompt_text).get("Features", "")
    return bool(feature_labels(value)[STORY_FEATURES.index(feature.lower())])


CLASSIFIER_VERSION = 3


_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?|[!?\"]")


def story_grams(text: str) -> set:
    """Lower-cased words (and ! ? ") and adjacent word pairs present in a story."""
    words = _WORD.findall(text.lower())
    return set(words) | {f"{a} {b}" for a, b in zip(words, words[1:])}


def word_salad(text: str, rng: random.Random) -> str:
    words = text.split()
    rng.shuffle(words)
    return " ".join(words)


def _raw_stories(paths, limit, feature):
    texts, labels = [], []
    for path in paths:
        for r in load_raw_shard(path)[:limit - len(texts)]:
            texts.append(r["story"])
            labels.append(int(feature in r["instruction"]["features"]))
        if len(texts) >= limit:
            break
    return texts, labels


class ClassifierJudge:
    """Logistic regression on story n-gram presence, labelled by the raw `features` field.

    Word-shuffled copies of half the training stories are added as negatives: without them a
    bag of words calls word salad (an untrained model's output) a twist half of the time, since
    it holds the right words; with them only word order (bigrams) can say yes."""

    name = "classifier:bow-logreg"

    def __init__(self, feature, vocab, weights, bias, stats):
        self.feature, self.bias, self.stats = feature, bias, stats
        self.accuracy = stats["accuracy"]
        self.weights = dict(zip(vocab, weights))

    @property
    def description(self):
        s = self.stats
        return (f"{self.name} (word 1-2-gram logistic regression on {s['n_train']} labelled train stories + "
                f"word-shuffled negatives; held-out accuracy {s['accuracy']:.4f} on {s['n_test']} test stories, "
                f"says yes to {s['salad_yes']:.3f} of word-shuffled {self.feature} stories)")

    def logit(self, story: str) -> float:
        return self.bias + sum(self.weights.get(g, 0.0) for g in story_grams(story))

    def judge(self, stories):
        return [int(self.logit(s) > 0) for s in stories]

    @classmethod
    def for_data(cls, feature, data_cache_dir, max_train=6000, max_test=2000, log=print):
        """Load the cached classifier for this raw corpus, or train and cache one."""
        raw = raw_data_dir(data_cache_dir)
        shards = sorted(glob.glob(os.path.join(raw, "data*.json")))
        if len(shards) < 2:
            raise UserError(f"the classifier judge trains on raw stories labelled by their features, but {raw} "
                            f"has {len(shards)} shard(s) (need the test shard data00 and a train shard): run "
                            f"python tinystories.py synthesize (or download) --data_cache_dir={data_cache_dir}")
        stamp = [(os.path.basename(p), os.path.getsize(p), os.stat(p).st_mtime_ns) for p in shards]
        key = hashlib.sha256(json.dumps([CLASSIFIER_VERSION, feature, max_train, max_test, stamp]).encode()).hexdigest()[:16]
        cache = os.path.join(data_cache_dir, "judges", f"{feature}-{key}.json")
        if os.path.isfile(cache):
            try:
                with open(cache) as f:
                    d = json.load(f)
                judge = cls(feature, d["vocab"], d["weights"], d["bias"], d["stats"])
                judge.description  # reads every stats field the outputs use
                return judge
            except (OSError, ValueError, KeyError, TypeError) as e:  # written atomically: only outside damage
                raise UserError(f"the cached {feature} judge {cache} is corrupt ({first_line(e)}); delete it "
                                f"and it is trained again") from None
        t0 = time.time()
        rng = random.Random(0)
        train_x, train_y = _raw_stories(shards[1:], max_train, feature)
        test_x, test_y = _raw_stories(shards[:1], max_test, feature)
        salad = [word_salad(s, rng) for s in train_x[:len(train_x) // 2]]
        vocab, weights, bias = train_logreg([story_grams(s) for s in train_x + salad], train_y + [0] * len(salad))
        judge = cls(feature, vocab, weights, bias, {"accuracy": 0.0, "salad_yes": 0.0})
        positives = [word_salad(s, rng) for s, y in zip(test_x, test_y) if y]
        judge.stats = {"accuracy": sum(p == y for p, y in zip(judge.judge(test_x), test_y)) / max(len(test_y), 1),
                       "salad_yes": sum(judge.judge(positives)) / max(len(positives), 1),
                       "n_train": len(train_x), "n_test": len(test_x)}
        judge.accuracy = judge.stats["accuracy"]
        os.makedirs(os.path.dirname(cache), exist_ok=True)
        write_atomic(cache, json.dumps({"feature": feature, "vocab": vocab, "weights": weights, "bias": bias,
                                        "stats": judge.stats}).encode())
        log(f"trained the {feature} judge in {time.time() - t0:.1f}s: {judge.description}")
        return judge


def train_logreg(gram_sets, labels, max_vocab=10000, min_count=2, steps=300, lr=0.1, l2=1e-4):
    """L2-regularised logistic regression on binary n-gram features, full-batch Adam written out
    (torch.optim's per-step overhead dominated this small problem). The design matrix is kept as
    (row, column) index pairs, so X @ w and X^T r are two index_adds; column V is the bias."""
    counts = Counter(g for s in gram_sets for g in s)
    vocab = [g for g, c in counts.most_common(max_vocab) if c >= min_count]
    index = {g: i for i, g in enumerate(vocab)}
    rows, cols = [], []
    for i, s in enumerate(gram_sets):
        ids = [index[g] for g in s if g in index] + [len(vocab)]
        cols += ids
        rows += [i] * len(ids)
    rows, cols = torch.tensor(rows), torch.tensor(cols)
    y = torch.tensor(labels, dtype=torch.float64)
    n, dim = len(gram_sets), len(vocab) + 1
    decay = torch.full((dim,), 2 * l2, dtype=torch.float64)
    decay[-1] = 0.0  # no penalty on the bias
    w, m, v = (torch.zeros(dim, dtype=torch.float64) for _ in range(3))
    beta1, beta2 = 0.9, 0.999
    for t in range(1, steps + 1):
        residual = (torch.sigmoid(torch.zeros(n, dtype=torch.float64).index_add_(0, rows, w[cols])) - y) / n
        grad = torch.zeros(dim, dtype=torch.float64).index_add_(0, cols, residual[rows]) + decay * w
        m.mul_(beta1).add_(grad, alpha=1 - beta1)
        v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        w -= lr * (m / (1 - beta1 ** t)) / ((v / (1 - beta2 ** t)).sqrt() + 1e-8)
    return vocab, w[:-1].tolist(), w[-1].item()


SYSTEM_PROMPT = "You are a helpful assistant answering questions about children's stories."


QUESTIONS = {
    "Twist": "Does the story have a twist?",
    "Dialogue": "Does the story contain dialogue?",
    "BadEnding": "Does the story have a bad ending?",
    "MoralValue": "Does the story have a moral value?",
    "Foreshadowing": "Does the story use foreshadowing?",
    "Conflict": "Does the story have a conflict?",
}


# two examples per question (the study's 2-shot): one story with the feature, and one plain story
# that has none of the six
PLAIN_STORY = ("Tom had a red ball. He went to the park with his dog. They played with the ball all day. "
               "When the sun went down, they walked home together.")


PLAIN_REASONING = "The story is a simple sequence of pleasant events and does not have this feature."


EXAMPLES = {
    "Twist": ("Lily heard a loud noise in the garden. She was sure it was a big monster. She looked behind the "
              "bush, but it was only a tiny kitten playing with a can.",
              "Lily expects a monster, but the noise turns out to be a kitten: an unexpected turn of events."),
    "Dialogue": ('Ben saw Mia at school. "Do you want to play?" he asked. "Yes, let\'s play tag!" said Mia.',
                 "Ben and Mia speak to each other in quoted speech."),
    "BadEnding": ("Sam built a tall tower of blocks. The wind blew it down and his best block was lost. "
                  "Sam cried and went to bed sad.",
                  "The story ends with a loss and sadness, not happily."),
    "MoralValue": ("Anna found a coin and gave it back to the old man who had lost it. He smiled. "
                   "Anna learned that being honest makes everyone happy.",
                   "The story states a lesson: being honest is good."),
    "Foreshadowing": ("In the morning, Max saw dark clouds over the hill, but he went out without his coat. "
                      "Later, it rained hard, just as the clouds had warned.",
                      "The dark clouds early on hint at the rain that comes later."),
    "Conflict": ("Zoe and Ben both wanted the red swing. They pulled and argued until Mom came. "
                 "In the end they took turns.",
                 "Zoe and Ben struggle over the swing: that is a conflict."),
}
assert set(QUESTIONS) == set(EXAMPLES) == set(FEATURES)  # one question and two examples per feature


def judge_messages(feature: str, story: str) -> list:
    """The chat messages that ask whether `story` has `feature` (system, 2 examples, the story)."""
    def ask(text):
        return {"role": "user", "content": f"Here is a story:\n<story>\n{text.strip()}\n</story>\n{QUESTIONS[feature]} "
                                           f"Think step by step inside <reasoning></reasoning> tags, then answer yes "
                                           f"or no inside <answer></answer> tags."}

    def reply(reasoning, answer):
        return {"role": "assistant", "content": f"<reasoning>{reasoning}</reasoning>\n<answer>{answer}</answer>"}
    example, reasoning = EXAMPLES[feature]
    return [{"role": "system", "content": SYSTEM_PROMPT},
            ask(example), reply(reasoning, "yes"),
            ask(PLAIN_STORY), reply(PLAIN_REASONING, "no"),
            ask(story)]


def parse_answer(text: str):
    """1 / 0 for a judge reply, and whether it was understood (the <answer> tag's content, or the
    whole reply without one, contains yes / no)."""
    m = re.search(r"<answer>(.*?)</answer>", text, re.S | re.I)
    answer = (m.group(1) if m else text).lower()
    if re.search(r"\byes\b", answer):
        return 1, True
    if re.search(r"\bno\b", answer):
        return 0, True
    return 0, False


class LLMJudge:
    """Yes/no judgments from an OpenAI-compatible /chat/completions endpoint."""

    def __init__(self, feature, url, model="gpt-3.5-turbo", timeout=30.0, api_key_env="OPENAI_API_KEY",
                 cache_path="", retries=2, log=print):
        if not re.match(r"https?://", url or ""):
            raise UserError(f"--judge_url must be an http(s) URL of an OpenAI-compatible API, got '{url}'")
        if timeout <= 0:
            raise UserError(f"--judge_timeout must be positive, got {timeout}")
        self.feature, self.model, self.timeout, self.retries, self.log = feature, model, timeout, retries, log
        self.endpoint = url.rstrip("/") if url.rstrip("/").endswith("/chat/completions") else url.rstrip("/") + "/chat/completions"
        self.api_key = os.environ.get(api_key_env, "")
        self.name = f"llm:{model}@{url}"
        self.description = f"{self.name} (OpenAI-compatible chat API, 2-shot yes/no protocol)"
        self.accuracy = None
        self.cache_path, self.cache, self.unparsed = cache_path, {}, 0
        if cache_path and os.path.exists(cache_path):
            i = 0
            try:
                with open(cache_path) as f:
                    for i, line in enumerate(f, 1):
                        if line.strip():
                            rec = json.loads(line)
                            if not isinstance(rec["reply"], str):
                                raise TypeError(f"'reply' is {type(rec['reply']).__name__}, not text")
                            self.cache[rec["key"]] = rec["reply"]
            except (OSError, ValueError, KeyError, TypeError) as e:
                where = f"{cache_path}:{i}" if i else cache_path
                raise UserError(f"--judge_cache {where} is not a cache of judge replies ({first_line(e)}); delete "
                                f"it (its replies are asked again) or pass another file") from None
        elif cache_path and not os.path.isdir(os.path.dirname(os.path.abspath(cache_path))):
            # found now, not at the first reply to be cached (after every story is generated)
            raise UserError(f"--judge_cache {cache_path}: the folder {os.path.dirname(os.path.abspath(cache_path))} "
                            f"does not exist")

    def _no_answer(self, e):
        import requests
        kind = "timed out" if isinstance(e, requests.exceptions.Timeout) else "could not be reached"
        return UserError(f"LLM judge at {self.endpoint} {kind} (timeout {self.timeout:g}s; "
                         f"{type(e).__name__}); check --judge_url or use --judge=classifier")

    def check_reachable(self):
        """One cheap request (HEAD: no tokens spent) with the configured timeout, so that a dead
        --judge_url fails before the stories are generated, not after. Any HTTP answer will do."""
        import requests
        try:
            requests.head(self.endpoint, timeout=(self.timeout, self.timeout))
        except requests.exceptions.RequestException as e:
            raise self._no_answer(e) from None

    def _post(self, body):
        import requests
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        for attempt in range(self.retries + 1):
            try:
                r = requests.post(self.endpoint, json=body, headers=headers, timeout=(self.timeout, self.timeout))
            except requests.exceptions.RequestException as e:
                raise self._no_answer(e) from None
            if (r.status_code == 429 or r.status_code >= 500) and attempt < self.retries:
                time.sleep(2 ** attempt)  # rate limit / server hiccup: a short bounded backoff
                continue
            if r.status_code != 200:
                raise UserError(f"LLM judge at {self.endpoint} answered HTTP {r.status_code}: {r.text.strip()[:160]}")
            try:
                return r.json()["choices"][0]["message"]["content"]
            except (ValueError, KeyError, IndexError, TypeError):
                raise UserError(f"LLM judge at {self.endpoint} sent a reply that is not a chat completion: "
                                f"{r.text.strip()[:160]}") from None

    def judge(self, stories):
        out = []
        for story in progress(stories, desc="judging", unit="story"):  # one request per uncached story
            messages = judge_messages(self.feature, story)
            key = hashlib.sha256(json.dumps([self.model, messages]).encode()).hexdigest()
            if key not in self.cache:
                body = {"model": self.model, "messages": messages, "temperature": 0, "max_tokens": 200}
                self.cache[key] = self._post(body)
                if self.cache_path:
                    with open(self.cache_path, "a") as f:
                        f.write(json.dumps({"key": key, "reply": self.cache[key]}) + "\n")
            verdict, understood = parse_answer(self.cache[key])
            if not understood:
                self.unparsed += 1
                self.log(f"warning: the judge's reply has neither yes nor no, counted as no: {self.cache[key][:120]!r}")
            out.append(verdict)
        return out


def make_judge(feature, data_cache_dir, kind="classifier", url="", model="gpt-3.5-turbo", timeout=30.0,
               cache_path="", log=print, flag="--feature"):
    check_feature(feature, flag)
    if kind == "classifier":
        return ClassifierJudge.for_data(feature, data_cache_dir, log=log)
    if kind == "llm":
        return LLMJudge(feature, url, model, timeout, cache_path=cache_path, log=log)
    raise UserError(f"--judge must be classifier or llm, not '{kind}'")


class FeatureScore:
    """Judges generation-table rows ([prefix, clean_prefix, generation, target, iter_num], as
    train.LMEvaluator.generate makes them) of one or more datasets and averages over the rows
    whose prompt asked for the feature."""

    def __init__(self, judge):
        self.judge, self.present = judge, {}

    def add(self, name, rows):
        asked = [r for r in rows if asks_for(r[0], self.judge.feature)]
        self.present[name] = self.judge.judge([r[2] for r in asked])
        return self.present[name]

    def metrics(self):
        """{"gen_feature_score": pooled, "gen_feature_score/<name>": per dataset}, for datasets
        with at least one prompt asking for the feature, with the judge that gave them
        ("gen_feature_judge": its description, "gen_feature_judge_accuracy": its held-out accuracy,
        None when unmeasured), so no logged score goes without them; then starts over (one call
        per eval)."""
        out = {f"gen_feature_score/{k}": sum(v) / len(v) for k, v in self.present.items() if v}
        pooled = [x for v in self.present.values() for x in v]
        self.present = {}
        if pooled:
            out["gen_feature_score"] = sum(pooled) / len(pooled)
            out["gen_feature_judge"] = self.judge.description
            out["gen_feature_judge_accuracy"] = self.judge.accuracy
        return out

