"""evaluation/eval_features.py: the offline classifier judge's held-out accuracy on a synthesized
corpus, the LLM judge's yes/no protocol against a local stub server (and a server that never
answers), the CLI's output, train.py's in-training feature score, and bad input."""
import http.server
import json
import os
import pathlib
import re
import socket
import threading
import time

import pytest
from conftest import assert_one_line_error, read_metrics, run_main, save_tiny_checkpoint, tiny_model

from evaluation.eval_features import main as eval_features_main
from tinylab.core.errors import UserError
from tinylab.data.records import FEATURES
from tinylab.eval.feature_judge import (
    ClassifierJudge,
    FeatureScore,
    LLMJudge,
    asks_for,
    parse_answer,
    wilson_ci,
    word_salad,
)


@pytest.fixture(scope="module")
def corpus(lab_corpus):
    return lab_corpus


@pytest.fixture(scope="module")
def ckpt(corpus, tmp_path_factory):
    # 128 positions hold a whole instruction header of the 8192-piece tokenizer plus a few new tokens
    return save_tiny_checkpoint(tmp_path_factory.mktemp("features_ckpt") / "ckpt.pt", tiny_model(max_seq_len=128),
                                cache_dir=corpus.cache_dir)


def eval_features(argv, **kw):
    return run_main("evaluation/eval_features.py", argv, **kw)


def raw_records(corpus, shard):
    with open(os.path.join(corpus.raw_dir, f"data{shard:02d}.json")) as f:
        return json.load(f)


@pytest.mark.slow
@pytest.mark.parametrize("feature", FEATURES)
def test_classifier_accuracy_on_synthesized_corpus(corpus, feature):
    judge = ClassifierJudge.for_data(feature, corpus.cache_dir)
    # recomputed here against the raw test shard's own features field, not taken from the judge
    test = raw_records(corpus, 0)
    verdicts = judge.judge([r["story"] for r in test])
    acc = sum(v == int(feature in r["instruction"]["features"]) for v, r in zip(verdicts, test)) / len(test)
    assert acc >= 0.9, (feature, acc)
    assert judge.accuracy == pytest.approx(acc) and judge.stats["n_test"] == len(test)
    assert judge.stats["n_train"] == 2 * corpus.stories_per_shard  # shards 1-2 only: the test shard is held out
    # cached: a second call loads the same classifier
    again = ClassifierJudge.for_data(feature, corpus.cache_dir)
    assert again.judge([r["story"] for r in test[:50]]) == verdicts[:50]


def test_classifier_rejects_word_salad(corpus):
    judge = ClassifierJudge.for_data("Twist", corpus.cache_dir)
    import random
    rng = random.Random(1)
    twists = [r["story"] for r in raw_records(corpus, 0) if "Twist" in r["instruction"]["features"]]
    assert sum(judge.judge(twists)) / len(twists) > 0.9
    assert sum(judge.judge([word_salad(s, rng) for s in twists])) / len(twists) < 0.2


def test_wilson_interval():
    assert wilson_ci(8, 16) == pytest.approx([0.2800, 0.7200], abs=1e-4)  # textbook values
    assert wilson_ci(1, 10) == pytest.approx([0.0179, 0.4042], abs=1e-4)
    assert wilson_ci(0, 10)[0] == 0.0 and wilson_ci(10, 10)[1] == 1.0


def test_feature_score_counts_only_prompts_that_ask():
    class Judge:
        feature, description, accuracy = "BadEnding", "sad-word judge", 0.75

        def judge(self, stories):
            return [int("sad" in s) for s in stories]
    rows = [["Features: Badending, Twist\nWords: a, b, c\nStory:", "", "a sad end", "", 0],
            ["Words: a, b, c\nFeatures: Badending\nStory:", "", "a happy end", "", 0],
            ["Features: Twist\nStory:", "", "a sad end", "", 0]]  # does not ask: not counted
    assert asks_for(rows[0][0], "BadEnding") and not asks_for(rows[2][0], "BadEnding")
    score = FeatureScore(Judge())
    score.add("id", rows)
    score.add("other", rows[2:])
    # every score is logged with the judge that gave it and the judge's held-out accuracy
    assert score.metrics() == {"gen_feature_score/id": 0.5, "gen_feature_score": 0.5,
                               "gen_feature_judge": "sad-word judge", "gen_feature_judge_accuracy": 0.75}
    assert score.metrics() == {}  # starts over after each evaluation
    # a judge without a measured accuracy (the LLM judge) says so: None
    llm = LLMJudge("BadEnding", "http://127.0.0.1:1/v1", model="m")
    llm.judge = Judge().judge
    score = FeatureScore(llm)
    score.add("id", rows)
    m = score.metrics()
    assert m["gen_feature_judge"] == llm.description and "llm:m@" in m["gen_feature_judge"]
    assert m["gen_feature_judge_accuracy"] is None


# ---------------------------------------------------------------------- LLM judge against a stub

class StubHandler(http.server.BaseHTTPRequestHandler):
    requests = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        StubHandler.requests.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
        story = body["messages"][-1]["content"]
        if "UNSURE" in story:
            reply = "I cannot tell."
        elif "surprise" in story:
            reply = "<reasoning>The ending is unexpected.</reasoning>\n<answer>Yes</answer>"
        elif "plain yes" in story:
            reply = "Yes, it does."  # no tags: the whole reply is read
        else:
            reply = "<reasoning>Nothing unexpected happens. Yes, really.</reasoning><answer>no</answer>"
        data = json.dumps({"choices": [{"message": {"role": "assistant", "content": reply}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def stub():
    StubHandler.requests = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StubHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_llm_judge_protocol(stub, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    warnings = []
    judge = LLMJudge("Twist", stub, model="stub-model", timeout=5, cache_path=str(tmp_path / "cache.jsonl"),
                     log=warnings.append)
    stories = ["To their surprise, the dragon was a kitten.", "They played all day.", "A plain yes story.",
               "UNSURE story.", "They played all day."]
    assert judge.judge(stories) == [1, 0, 1, 0, 0]
    assert len(warnings) == 1 and "neither yes nor no" in warnings[0]
    assert len(StubHandler.requests) == 4  # the repeated story came from the cache
    req = StubHandler.requests[0]
    assert req["path"] == "/v1/chat/completions" and req["auth"] == "Bearer sk-test"
    body = req["body"]
    assert body["model"] == "stub-model" and body["temperature"] == 0 and body["max_tokens"] == 200
    roles = [m["role"] for m in body["messages"]]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user"]  # 2-shot
    assert "children's stories" in body["messages"][0]["content"]
    assert "<answer>yes</answer>" in body["messages"][2]["content"] and "<answer>no</answer>" in body["messages"][4]["content"]
    last = body["messages"][-1]["content"]
    assert stories[0] in last and "Does the story have a twist?" in last and "<answer>" in last
    # the cache file serves a new judge without any request
    again = LLMJudge("Twist", stub, model="stub-model", timeout=5, cache_path=str(tmp_path / "cache.jsonl"))
    assert again.judge(stories[:2]) == [1, 0] and len(StubHandler.requests) == 4
    assert judge.name == f"llm:stub-model@{stub}" and judge.accuracy is None


def test_llm_judge_shows_progress(stub, monkeypatch):
    import tinylab.eval.feature_judge as EF
    bars = []

    def recording_progress(iterable, **kwargs):
        bars.append((len(iterable), kwargs))
        return iterable
    monkeypatch.setattr(EF, "progress", recording_progress)
    judge = LLMJudge("Twist", stub, model="stub-model", timeout=5)
    assert judge.judge(["a surprise", "a plain day", "another surprise"]) == [1, 0, 1]
    assert len(bars) == 1 and bars[0][0] == 3 and bars[0][1]["desc"] == "judging"


def test_corrupt_judge_caches_are_one_line_errors(corpus, ckpt, tmp_path):
    # the LLM judge's reply cache: a line that is not JSON, a record without a reply, a folder
    cache = tmp_path / "replies.jsonl"
    for content, fragment in [('{"key": "k", "reply": "yes"}\n{not json\n', "replies.jsonl:2"),
                              ('{"key": "k"}\n', "replies.jsonl:1"),
                              ('{"key": "k", "reply": 3}\n', "replies.jsonl:1")]:
        cache.write_text(content)
        with pytest.raises(UserError, match=re.escape(fragment) + ".*delete it"):
            LLMJudge("Twist", "http://127.0.0.1:1/v1", cache_path=str(cache))
    with pytest.raises(UserError, match="not a cache of judge replies.*delete it"):
        LLMJudge("Twist", "http://127.0.0.1:1/v1", cache_path=str(tmp_path))
    with pytest.raises(UserError, match="does not exist"):
        LLMJudge("Twist", "http://127.0.0.1:1/v1", cache_path=str(tmp_path / "no" / "replies.jsonl"))
    # through the command line: one line, before any model is loaded or story generated
    cache.write_text("{not json\n")
    assert_one_line_error(eval_features([f"--checkpoint={ckpt}", "--prompts_from=filter-adv-Twist", "--judge=llm",
                                         "--judge_url=http://127.0.0.1:1/v1", f"--judge_cache={cache}"]),
                          f"{cache}:1", "delete it")
    # the classifier's cache in <data_cache_dir>/judges/: truncated, or a record without its fields
    ClassifierJudge.for_data("Twist", corpus.cache_dir)
    [path] = pathlib.Path(corpus.cache_dir, "judges").glob("Twist-*.json")
    good = path.read_bytes()
    try:
        for bad in (good[:len(good) // 2], b'{"vocab": [], "weights": [], "bias": 0.0, "stats": {}}'):
            path.write_bytes(bad)
            with pytest.raises(UserError, match=re.escape(str(path)) + ".*is corrupt.*delete it"):
                ClassifierJudge.for_data("Twist", corpus.cache_dir)
        path.write_bytes(good[:100])
        assert_one_line_error(eval_features([f"--checkpoint={ckpt}", "--prompts_from=filter-adv-Twist", "--device=cpu"]),
                              str(path), "delete it")
    finally:
        path.write_bytes(good)


def test_inputs_are_checked_before_the_judge_and_generation(corpus, ckpt, monkeypatch):
    """A bad --prompts_from must not cost a classifier training (nor cache one), and a dead
    --judge_url must fail before the stories are generated, not after."""
    import evaluation.eval_features as EF
    import tinylab.eval.feature_judge as judges

    def forbidden(*args, **kwargs):
        raise AssertionError("expensive work before the inputs were checked")
    monkeypatch.setattr(judges.ClassifierJudge, "for_data", forbidden)
    monkeypatch.setattr(EF, "generate_rows", forbidden)
    base = [f"--checkpoint={ckpt}", "--device=cpu", "--max_new_tokens=8"]
    with pytest.raises(UserError, match="no-such-set.*pretokenize"):
        eval_features_main(base + ["--prompts_from=no-such-set"])
    with pytest.raises(UserError, match="no-such-set.*pretokenize"):
        eval_features_main(base + ["--prompts_from=no-such-set", "--judge=llm", "--judge_url=http://127.0.0.1:1/v1"])
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()
    t0 = time.time()
    with pytest.raises(UserError, match="could not be reached"):
        eval_features_main(base + ["--prompts_from=filter-adv-Twist", "--judge=llm",
                                   f"--judge_url=http://127.0.0.1:{port}/v1", "--judge_timeout=2"])
    assert time.time() - t0 < 30


def test_parse_answer():
    assert parse_answer("<answer> YES </answer>") == (1, True)
    assert parse_answer("<reasoning>yes</reasoning><answer>No.</answer>") == (0, True)
    assert parse_answer("I do not know") == (0, False)


@pytest.mark.slow
def test_cli_llm_judge_and_unanswering_url(stub, corpus, ckpt, tmp_path):
    base = [f"--checkpoint={ckpt}", "--prompts_from=filter-adv-Twist", "--num_samples=3", "--batch_size=3",
            "--max_new_tokens=8", "--device=cpu"]
    proc = eval_features(base + ["--judge=llm", f"--judge_url={stub}", "--judge_model=stub-model"], check=True)
    metrics = json.loads(proc.stdout.strip().splitlines()[-1])
    assert metrics["judge"] == f"llm:stub-model@{stub}" and metrics["judge_accuracy"] is None
    assert metrics["n"] == 3 and len({r["body"]["messages"][-1]["content"] for r in StubHandler.requests}) <= 3
    # a server that accepts connections but never answers: a timeout, one line, no hang
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    t0 = time.time()
    proc = eval_features(base + ["--judge=llm", f"--judge_url=http://127.0.0.1:{silent.getsockname()[1]}/v1",
                                 "--judge_timeout=1"])
    assert_one_line_error(proc, "timed out")
    assert time.time() - t0 < 100
    silent.close()
    # nothing listening at all
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()
    assert_one_line_error(eval_features(base + ["--judge=llm", f"--judge_url=http://127.0.0.1:{port}/v1",
                                                "--judge_timeout=1"]), "could not be reached")


def test_cli_classifier_judge(corpus, ckpt, tmp_path):
    out = tmp_path / "m.json"
    gens = tmp_path / "g.jsonl"
    proc = eval_features([f"--checkpoint={ckpt}", "--feature=Twist", "--prompts_from=filter-adv-Twist",
                          "--num_samples=4", "--batch_size=2", "--max_new_tokens=8", "--device=cpu", f"--out={out}",
                          f"--generations_out={gens}"], check=True)
    metrics = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(metrics) == {"feature", "score", "ci95", "n", "judge", "judge_accuracy"}
    assert metrics["feature"] == "Twist" and metrics["n"] == 4 and metrics["judge"] == "classifier:bow-logreg"
    assert metrics["judge_accuracy"] >= 0.9 and "classifier:bow-logreg" in proc.stdout
    rows = [json.loads(line) for line in gens.read_text().splitlines()]
    assert len(rows) == 4 and all("Twist" in r["prompt"] for r in rows)
    assert metrics["score"] == sum(r["has_feature"] for r in rows) / 4
    assert metrics["ci95"] == wilson_ci(sum(r["has_feature"] for r in rows), 4)
    assert json.loads(out.read_text()) == metrics


def test_bad_input(corpus, ckpt, tmp_path):
    base = [f"--checkpoint={ckpt}", "--device=cpu", "--max_new_tokens=8"]
    # one through the command line's error boundary: one line on stderr, exit 2
    proc = eval_features(base + ["--feature=twist", "--prompts_from=filter-adv-Twist"])
    assert_one_line_error(proc, "did you mean 'Twist'")
    assert proc.returncode == 2
    cases = [
        (base + ["--feature=Sarcasm", "--prompts_from=filter-adv-Twist"], "--feature='Sarcasm': must be one of"),
        (base + ["--prompts_from=no-such-set"], "pretokenize"),
        ([f"--checkpoint={tmp_path}/x.pt", "--prompts_from=filter-adv-Twist"], "checkpoint not found"),
        (base + ["--prompts_from=filter-adv-Twist", "--judge=llm", "--judge_url=localhost:1"], "--judge_url"),
        (base + ["--prompts_from=filter-adv-Twist", "--num_samples=0"], "--num_samples"),
        (base + ["--prompts_from=pretrain-all", "--feature=Twist", "--judge=llm", "--judge_url=http://127.0.0.1:1",
                 "--judge_timeout=0"], "--judge_timeout"),
    ]
    for argv, fragment in cases:
        with pytest.raises(UserError, match=re.escape(fragment)):
            eval_features_main(argv)
    # the classifier needs raw stories with their features field
    with pytest.raises(UserError, match="synthesize"):
        ClassifierJudge.for_data("Twist", str(tmp_path / "empty_cache"))


@pytest.mark.slow
def test_in_training_feature_score(corpus, tmp_path):
    out = str(tmp_path / "run")
    args = dict(data_cache_dir=corpus.cache_dir, vocab_size=8192, dataset_name="pretrain-all", out_dir=out, dim=32,
                n_layers=2, n_heads=4, n_kv_heads=2, multiple_of=16, max_seq_len=128, batch_size=4,
                gradient_accumulation_steps=1, learning_rate=3e-3, warmup_iters=2, max_iters=4, eval_interval=2,
                eval_iters=1, max_new_tokens=12, generation_batch_size=4, device="cpu", dtype="float32",
                feature_eval="Twist", eval_dataset_names='["filter-adv-Twist"]')
    run_main("train.py", [f"--{k}={v}" for k, v in args.items()], check=True)
    rows = read_metrics(out)
    evals = [r for r in rows if r["kind"] == "eval"]
    assert [r["iter"] for r in evals] == [0, 2, 4]
    judge = ClassifierJudge.for_data("Twist", corpus.cache_dir)
    for ev in evals:
        # recomputed from the logged generation tables: only prompts that ask for a Twist count
        tables = {k: r[k] for r in rows if r["kind"] == "table" and r["iter"] == ev["iter"] for k in r
                  if k.startswith("generations/")}
        pooled = []
        for name, table in tables.items():
            asked = [g["generation"] for g in table if re.search(r"^Features:.*\bTwist\b", g["prefix"], re.M)]
            verdicts = judge.judge(asked)
            pooled += verdicts
            if verdicts:
                assert ev[f"gen_feature_score/{name.split('/')[1]}"] == pytest.approx(sum(verdicts) / len(verdicts))
        assert len(tables["generations/filter-adv-Twist"]) == 4  # every adversarial prompt asks
        assert ev["gen_feature_score"] == pytest.approx(sum(pooled) / len(pooled))
        # the judge is named and its held-out accuracy logged next to every score
        assert ev["gen_feature_judge"] == judge.description and "classifier:bow-logreg" in ev["gen_feature_judge"]
        assert ev["gen_feature_judge_accuracy"] == pytest.approx(judge.accuracy)
    # --tables scores the same logged tables after the fact: the same numbers, appended as new records
    before = open(os.path.join(out, "metrics.jsonl"), "rb").read()
    proc = eval_features([f"--tables={out}", "--feature=Twist"], check=True)
    after = open(os.path.join(out, "metrics.jsonl"), "rb").read()
    assert after.startswith(before)
    scored = [r for r in read_metrics(out)[len(rows):]]
    assert [r["kind"] for r in scored] == ["feature_score"] * 3 and [r["iter"] for r in scored] == [0, 2, 4]
    for ev, r in zip(evals, scored):
        assert {k: r[k] for k in ev if k.startswith("gen_feature")} == {k: ev[k] for k in ev if k.startswith("gen_feature")}
        assert r["feature"] == "Twist" and r["gen_feature_score_n"] > 0 and r["tables"] == os.path.join(out, "metrics.jsonl")
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (last["iter"], last["score"], [p["iter"] for p in last["per_iter"]]) == (4, evals[-1]["gen_feature_score"], [0, 2, 4])
    # plot.py draws the numeric ones and does not offer the judge's name as a curve
    import plot as plot_cli
    plot_cli.main([out, "--metrics=gen_feature_score,gen_feature_judge_accuracy", f"--out={tmp_path}/curves.png"])
    assert os.path.getsize(tmp_path / "curves.png") > 0
    with pytest.raises(UserError, match="no input has the metric 'gen_feature_judge'"):
        plot_cli.main([out, "--metrics=gen_feature_judge", f"--out={tmp_path}/x.png"])
    bad = dict(args, feature_eval="twist", out_dir=str(tmp_path / "bad"))
    assert_one_line_error(run_main("train.py", [f"--{k}={v}" for k, v in bad.items()]), "feature_eval", "'Twist'")


# ---------------------------------------------------------------------- --tables: logged generations, scored later

def twist_rows(corpus, iter_num, n=6):
    """Generation-table rows as the study's train.py logged them: a prompt asking for a Twist and a
    raw generation that runs on into the next example's header (which the scorer must cut off)."""
    stories = [r for r in raw_records(corpus, 0)][:n]
    return [{"prefix": "Features: Twist\nWords: a, b, c\nStory:", "clean_prefix": "Features: Twist\nWords: a, b, c\nStory:",
             "generation": " " + r["story"] + "\nSummary: something else\nFeatures: Dialogue", "target": "",
             "iter_num": iter_num} for r in stories]


class FakeArtifact:
    def __init__(self, name, type_, table):
        self.name, self.type, self.table = name, type_, table

    def file(self, root):
        os.makedirs(root, exist_ok=True)
        path = os.path.join(root, "generations.table.json")
        with open(path, "w") as f:
            json.dump({"columns": list(self.table[0]), "data": [list(r.values()) for r in self.table]}, f)
        return path


def test_tables_from_a_wandb_run(corpus, tmp_path, monkeypatch):
    import sys
    import types
    tables = {0: twist_rows(corpus, 0), 2: twist_rows(corpus, 2, 4)}
    arts = [FakeArtifact(f"run-r1-generationsfilter-adv-Twist:v{k}", "run_table", t) for k, t in enumerate(tables.values())]
    arts += [FakeArtifact("run-r1-generationsid:v0", "model", tables[0]),  # not a table
             FakeArtifact("run-r1-othertable:v0", "run_table", tables[0])]  # not a generation table
    run = types.SimpleNamespace(entity="ent", project="proj", id="r1", config={"data_cache_dir": corpus.cache_dir},
                                logged_artifacts=lambda: arts)
    asked, logged = [], []

    class Api:
        def run(self, path):
            asked.append(path)
            if path != "ent/proj/r1":
                raise ValueError(f"Could not find run {path}")
            return run

    def init(**kw):
        logged.append(("init", kw))
        return types.SimpleNamespace(log=lambda d: logged.append(("log", d)), finish=lambda: logged.append(("finish",)))
    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(Api=Api, init=init))
    proc = eval_features(["--tables=https://wandb.ai/ent/proj/runs/r1", "--feature=Twist"], check=True)
    assert asked == ["ent/proj/r1"]
    judge = ClassifierJudge.for_data("Twist", corpus.cache_dir)
    expected = {}
    for it, rows in tables.items():  # the story is the generation cut at the next example's header
        verdicts = judge.judge([r["generation"].split("\nSummary:")[0].strip() for r in rows])
        expected[it] = sum(verdicts) / len(verdicts)
    assert logged[0] == ("init", {"entity": "ent", "project": "proj", "id": "r1", "resume": "must"})
    logs = [e[1] for e in logged if e[0] == "log"]
    assert [d["iter_num_gen"] for d in logs] == [0, 2] and logged[-1] == ("finish",)
    for d in logs:
        assert d["gen_feature_score"] == pytest.approx(expected[d["iter_num_gen"]])
        assert d["gen_feature_score/filter-adv-Twist"] == d["gen_feature_score"]
        assert d["gen_feature_score_n"] == len(tables[d["iter_num_gen"]])
        assert all(isinstance(v, (int, float)) for v in d.values())  # wandb gets numbers only
    assert json.loads(proc.stdout.strip().splitlines()[-1])["score"] == pytest.approx(expected[2])
    # a run path wandb does not know: one line, nothing logged
    logged.clear()
    assert_one_line_error(eval_features(["--tables=ent/proj/nope"]), "cannot read that wandb run", "Could not find")
    assert logged == []


def test_tables_bad_input_writes_nothing(corpus, ckpt, tmp_path):
    log = tmp_path / "run" / "metrics.jsonl"
    log.parent.mkdir()
    log.write_text(json.dumps({"iter": 0, "kind": "eval", "loss/test": 3.0}) + "\n")
    no_twist = tmp_path / "other" / "metrics.jsonl"
    no_twist.parent.mkdir()
    rows = [dict(r, prefix="Features: Dialogue\nStory:") for r in twist_rows(corpus, 0, 2)]
    no_twist.write_text(json.dumps({"iter": 0, "kind": "table", "generations/id": rows}) + "\n")
    before = {p: p.read_bytes() for p in (log, no_twist)}
    cases = [
        ([f"--tables={log}"], "has no generation tables"),
        ([f"--tables={log.parent}"], "has no generation tables"),
        ([f"--tables={tmp_path}/missing/metrics.jsonl"], "no metrics.jsonl there"),
        ([f"--tables={tmp_path}/missing"], "not a wandb run path"),
        ([f"--tables={no_twist}", "--feature=Twist"], "asks for Twist"),
        ([f"--tables={no_twist}", "--prompts_from=filter-adv-Twist"], "pass one of them"),
        ([f"--checkpoint={ckpt}"], "give --prompts_from=DATASET"),
    ]
    for argv, fragment in cases:
        assert_one_line_error(eval_features(argv + ["--out=" + str(tmp_path / "m.json")]), fragment)
    assert {p: p.read_bytes() for p in (log, no_twist)} == before
    assert sorted(os.listdir(tmp_path)) == ["other", "run"]
