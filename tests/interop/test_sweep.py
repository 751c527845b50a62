"""sweep.py: the offline runner for wandb sweep YAMLs.

The command lines are compared with what the installed `wandb` agent itself builds (its
`Agent._command_run`, with the process launch replaced by a recorder); draws are checked against
each distribution's definition; end-to-end runs use a small stand-in program (a DEFAULTS dict and
the project's configurator), and the repository's own sweeps are validated against the real
train.py config keys.
"""
import glob
import json
import math
import os
import textwrap

import pytest
from conftest import REPO, assert_one_line_error, read_metrics, run_main

from tinylab.interop import sweep_file as sweep
from tinylab.interop import sweeps as runner
from tinylab.schema import TRAIN

# a program with the interface sweep.py relies on: DEFAULTS (importable without side effects),
# the configurator, out_dir/metrics.jsonl; batch_size=13 fails on purpose
FAKE_PROGRAM = textwrap.dedent('''
    import json, os, sys
    DEFAULTS = {"learning_rate": 1e-3, "batch_size": 8, "out_dir": "out/{batch_size}", "wandb_log": False,
                "dataset_name": "a", "use_x": True}
    if __name__ == "__main__":
        from tinylab.core.config import Schema
        cfg = Schema.from_defaults("fake_train.py", DEFAULTS).parse()
        os.makedirs(cfg["out_dir"], exist_ok=True)
        with open(os.path.join(cfg["out_dir"], "metrics.jsonl"), "a") as f:
            for it in range(3):
                f.write(json.dumps({"iter": it, "loss/test": cfg["learning_rate"] * cfg["batch_size"] * (3 - it),
                                    "wandb_mode": os.environ.get("WANDB_MODE")}) + "\\n")
            f.write('{"iter": 3, "generations/id": [{"prefix": "x"}]}\\n')
        sys.exit(3 if cfg["batch_size"] == 13 else 0)
''')


def fake_workdir(tmp_path, yaml_text):
    (tmp_path / "fake_train.py").write_text(FAKE_PROGRAM)
    (tmp_path / "s.yaml").write_text(textwrap.dedent(yaml_text))
    return tmp_path


def run_sweep(workdir, *args):
    # sweep.py in this process (its runs are its own subprocesses); the runs import the project's
    # configurator, as train.py does from the repository root
    return run_main("sweep.py", [str(workdir / "s.yaml"), f"--workdir={workdir}", *args], cwd=REPO,
                    env={"PYTHONPATH": REPO})


# ---------------------------------------------------------------------- commands = wandb agent's

def wandb_agent_argv(command, program, values, monkeypatch, tmp_path):
    """The argv the installed wandb agent builds for one run of `values`."""
    from wandb import wandb_agent
    captured = {}

    class Recorder:  # stands in for the agent's subprocess launcher
        def __init__(self, command=None, **kwargs):
            captured["argv"] = command

    monkeypatch.setattr(wandb_agent, "AgentProcess", Recorder)
    for var in ("WANDB_DIR", "WANDB_SWEEP_ID", "WANDB_RUN_ID", "WANDB_SWEEP_PARAM_PATH"):
        monkeypatch.setenv(var, str(tmp_path) if var == "WANDB_DIR" else "x")  # restored after the test
    agent = wandb_agent.Agent(api=None, queue=None, sweep_id="x")
    agent._sweep_command = list(command)
    agent._command_run({"run_id": "r1", "program": program, "args": {k: {"value": v} for k, v in values.items()}})
    return captured["argv"], os.path.join(str(tmp_path), "wandb", "sweep-x", "config-r1.json")


VALUES = {"learning_rate": 3e-4, "batch_size": 16, "wandb_log": True, "use_x": False, "dataset_name": "filter-Twist",
          "out_dir": "out/a b", "min_lr": 1.0e-5, "eval_dataset_names": ["x", "y"], "tokenizer_model": None}


@pytest.mark.slow
@pytest.mark.parametrize("command", [
    sweep.DEFAULT_COMMAND,
    ["${env}", "${interpreter}", "${program}", "configs/base91M_tw_delete_no_lrs.py", "${args}"],
    ["${env}", "${interpreter}", "${program}", "${args_no_hyphens}"],
    ["${interpreter}", "${program}", "${args_no_equals}", "${args_no_boolean_flags}", "${args_json}"],
    ["${env}", "python3", "-u", "${program}", "--tag=${envvar:SWEEP_TEST_TAG}", "${envvar:SWEEP_TEST_UNSET}", "${args}"],
])
def test_commands_equal_the_wandb_agent(command, monkeypatch, tmp_path):
    monkeypatch.setenv("SWEEP_TEST_TAG", "t1")
    monkeypatch.delenv("SWEEP_TEST_UNSET", raising=False)
    theirs, _ = wandb_agent_argv(command, "train.py", VALUES, monkeypatch, tmp_path)
    ours = sweep.build_command(command, "train.py", VALUES, "unused.json")
    assert ours == theirs


@pytest.mark.slow
def test_args_json_file_macro_matches_the_agent(monkeypatch, tmp_path):
    command = ["${env}", "${interpreter}", "${program}", "${args_json_file}"]
    theirs, their_file = wandb_agent_argv(command, "train.py", VALUES, monkeypatch, tmp_path)
    ours = sweep.build_command(command, "train.py", VALUES, "/sweep/run-000.args.json")
    # the file path is each runner's own; the contents are what matters to the program
    assert ours[:-1] == theirs[:-1] and theirs[-1] == their_file and ours[-1] == "/sweep/run-000.args.json"
    assert json.loads(open(their_file).read()) == json.loads(json.dumps(VALUES))


def test_each_macro_expands_as_documented():
    values = {"lr": 0.1, "flag": True, "off": False, "name": "x"}
    expanded = sweep.command_args(values)
    assert expanded["args"] == ["--lr=0.1", "--flag=True", "--off=False", "--name=x"]
    assert expanded["args_no_hyphens"] == ["lr=0.1", "flag=True", "off=False", "name=x"]
    assert expanded["args_no_equals"] == ["--lr", "0.1", "--flag", "True", "--off", "False", "--name", "x"]
    assert expanded["args_no_boolean_flags"] == ["--lr=0.1", "--flag", "--name=x"]
    assert expanded["args_json"] == ['{"lr": 0.1, "flag": true, "off": false, "name": "x"}']


def test_expanded_args_parse_in_our_configurator():
    values = {"learning_rate": 3e-4, "batch_size": 16, "wandb_log": True, "dataset_name": "filter-Twist",
              "decay_lr": False, "eval_dataset_names": ["x", "y"], "min_lr": 1e-5, "dropout": 0.1}
    argv = sweep.build_command(sweep.DEFAULT_COMMAND, "train.py", values, "unused.json")
    assert argv[:3] == ["/usr/bin/env", "python", "train.py"]
    cfg = TRAIN.parse(argv[3:])
    for k, v in values.items():
        assert cfg[k] == v and type(cfg[k]) is type(v), k


# ---------------------------------------------------------------------- expansion and sampling

def test_grid_is_the_cartesian_product_in_yaml_order():
    params = {"a": {"values": [1, 2, 3]}, "b": {"value": "x"}, "c": {"values": [True, False]}}
    configs = sweep.grid_configs(params)
    assert len(configs) == 6
    assert [(c["a"], c["c"]) for c in configs] == [(1, True), (1, False), (2, True), (2, False), (3, True), (3, False)]
    assert all(c["b"] == "x" and list(c) == ["a", "b", "c"] for c in configs)
    assert sweep.configurations({"method": "grid", "parameters": params}, count=4) == configs[:4]


DISTRIBUTION_CASES = {
    # name: (spec, check(x))
    "constant": ({"value": 7}, lambda x: x == 7),
    "categorical": ({"values": ["a", "b", "c"], "probabilities": [0.0, 0.5, 0.5]}, lambda x: x in ("b", "c")),
    "int_uniform": ({"min": 2, "max": 5}, lambda x: isinstance(x, int) and 2 <= x <= 5),
    "uniform": ({"min": -1.5, "max": 2.5}, lambda x: -1.5 <= x <= 2.5),
    "q_uniform": ({"min": 0, "max": 10, "q": 2}, lambda x: isinstance(x, int) and x % 2 == 0 and 0 <= x <= 10),
    "log_uniform": ({"min": -3.0, "max": 1.0}, lambda x: math.exp(-3) <= x <= math.exp(1)),
    "log_uniform_values": ({"min": 1e-5, "max": 1e-2}, lambda x: 1e-5 <= x <= 1e-2),
    "q_log_uniform": ({"min": 0.0, "max": 4.0, "q": 5}, lambda x: isinstance(x, int) and x % 5 == 0 and x <= 55),
    "q_log_uniform_values": ({"min": 1, "max": 1000, "q": 0.5}, lambda x: (x / 0.5).is_integer() and 0.5 <= x <= 1000),
    "inv_log_uniform": ({"min": 1.0, "max": 3.0}, lambda x: math.exp(-3) <= x <= math.exp(-1)),
    "inv_log_uniform_values": ({"min": 0.01, "max": 0.1}, lambda x: 0.01 <= x <= 0.1),
    "normal": ({"mu": 5.0, "sigma": 0.1}, lambda x: 4.4 < x < 5.6),
    "q_normal": ({"mu": 0.0, "sigma": 10.0, "q": 3}, lambda x: isinstance(x, int) and x % 3 == 0),
    "log_normal": ({"mu": 0.0, "sigma": 0.5}, lambda x: x > 0),
    "q_log_normal": ({"mu": 2.0, "sigma": 0.3, "q": 1}, lambda x: isinstance(x, int) and x >= 0),
}


@pytest.mark.parametrize("dist", sorted(DISTRIBUTION_CASES))
def test_random_draws_are_seeded_and_follow_the_distribution(dist):
    spec, ok = DISTRIBUTION_CASES[dist]
    spec = dict(spec, distribution=dist)
    sweep.check_parameter("p", spec)
    params = {"p": spec}
    first = [c["p"] for c in sweep.random_configs(params, 300, seed=1)]
    assert first == [c["p"] for c in sweep.random_configs(params, 300, seed=1)]  # reproducible
    assert all(ok(x) for x in first), [x for x in first if not ok(x)][:5]
    if dist != "constant":
        assert first != [c["p"] for c in sweep.random_configs(params, 300, seed=2)]
    if dist in ("log_uniform_values", "inv_log_uniform_values"):
        # log-uniform: the mean of log x is the middle of the log bounds
        logs = [math.log(x) for x in first]
        mid = (math.log(spec["min"]) + math.log(spec["max"])) / 2
        assert abs(sum(logs) / len(logs) - mid) < 0.25
    if dist == "int_uniform":
        assert set(first) == {2, 3, 4, 5}  # both ends included


def test_inferred_distributions():
    assert sweep.distribution_of("p", {"values": [1]}) == "categorical"
    assert sweep.distribution_of("p", {"value": 1}) == "constant"
    assert sweep.distribution_of("p", {"min": 1, "max": 4}) == "int_uniform"
    assert sweep.distribution_of("p", {"min": 0.1, "max": 4}) == "uniform"
    # PyYAML reads 1e-4 as a string; bounds that look like numbers are numbers
    spec = {"distribution": "log_uniform_values", "min": "1e-5", "max": "1e-3"}
    sweep.check_parameter("p", spec)
    assert spec["min"] == 1e-5 and 1e-5 <= sweep.random_configs({"p": spec}, 1, 0)[0]["p"] <= 1e-3


# ---------------------------------------------------------------------- running

GRID_YAML = """\
    program: fake_train.py
    method: grid
    metric: {name: loss/test, goal: minimize}
    parameters:
      learning_rate:
        values: [0.001, 0.01]
      batch_size:
        values: [8, 13]
      wandb_log:
        value: true
    command:
      - ${env}
      - ${interpreter}
      - ${program}
      - ${args}
"""


def test_dry_run_prints_the_commands_and_writes_nothing(tmp_path):
    wd = fake_workdir(tmp_path, GRID_YAML)
    proc = run_sweep(wd, "--dry_run")
    assert proc.returncode == 0, proc.stderr
    lines = [l for l in proc.stdout.splitlines() if not l.startswith("#")]
    # out_dir="out/{batch_size}" is shared by two runs each, so every run gets its own (announced)
    assert lines[0] == ("/usr/bin/env python fake_train.py --learning_rate=0.001 --batch_size=8 --wandb_log=True "
                        f"--out_dir={wd / 'out/sweeps/s/run-000'}")
    assert len(lines) == 4 and "--batch_size=13 --wandb_log=True --out_dir=" in lines[1]
    assert "share out_dir out/8" in proc.stderr
    assert not (wd / "out").exists()


def test_runs_offline_records_results_and_skips_completed(tmp_path):
    wd = fake_workdir(tmp_path, GRID_YAML)
    proc = run_sweep(wd)
    assert proc.returncode == 1  # two configurations fail (batch_size=13)
    results = [json.loads(l) for l in (wd / "out/sweeps/s/results.jsonl").read_text().splitlines()]
    assert [(r["params"]["learning_rate"], r["params"]["batch_size"], r["exit_code"]) for r in results] == \
        [(0.001, 8, 0), (0.001, 13, 3), (0.01, 8, 0), (0.01, 13, 3)]
    for r in results:
        lr, bs = r["params"]["learning_rate"], r["params"]["batch_size"]
        assert r["final"] == pytest.approx(lr * bs) and r["best"] == pytest.approx(lr * bs)
        assert r["argv"][:3] == ["/usr/bin/env", "python", "fake_train.py"]
        rows = read_metrics(r["out_dir"])
        assert rows[0]["wandb_mode"] == "offline"
    # out_dir="out/{batch_size}" would put two runs in one folder: each got its own
    assert len({r["out_dir"] for r in results}) == 4 and "--out_dir=" in results[0]["argv"][-1]
    assert "run-000" in proc.stdout and "loss/test" in proc.stdout  # the printed table
    # a second start re-runs only the failed configurations
    again = run_sweep(wd, "--wandb_mode=disabled")
    assert again.returncode == 1 and "skipping 2 configuration(s)" in again.stdout
    results = [json.loads(l) for l in (wd / "out/sweeps/s/results.jsonl").read_text().splitlines()]
    assert len(results) == 6 and {r["params"]["batch_size"] for r in results[4:]} == {13}
    # the re-run's metric comes from its own records, not the first attempt's
    assert results[5]["final"] == pytest.approx(0.13)


def test_random_sweep_with_count_and_distinct_out_dirs(tmp_path):
    wd = fake_workdir(tmp_path, """\
        program: fake_train.py
        method: random
        metric: {name: loss/test, goal: maximize}
        parameters:
          learning_rate: {distribution: log_uniform_values, min: 1e-4, max: 1e-2}
          batch_size: {values: [2, 4, 6, 8, 10, 12, 14, 16]}
        """)
    proc = run_sweep(wd, "--count=4", "--seed=5")
    assert proc.returncode == 0, proc.stderr
    results = [json.loads(l) for l in (wd / "out/sweeps/s/results.jsonl").read_text().splitlines()]
    expected = sweep.random_configs({"learning_rate": {"distribution": "log_uniform_values", "min": 1e-4, "max": 1e-2},
                                     "batch_size": {"values": [2, 4, 6, 8, 10, 12, 14, 16]}}, 4, 5)
    assert [r["params"] for r in results] == expected
    for r in results:
        assert r["best"] == pytest.approx(3 * r["params"]["learning_rate"] * r["params"]["batch_size"])  # maximize
        assert r["final"] == pytest.approx(r["params"]["learning_rate"] * r["params"]["batch_size"])
    # out_dir="out/{batch_size}": --out_dir is appended exactly when two draws share a batch size
    shared = len({c["batch_size"] for c in expected}) < len(expected)
    assert any(a.startswith("--out_dir=") for a in results[0]["argv"]) == shared
    assert len({r["out_dir"] for r in results}) == 4


@pytest.mark.parametrize("yaml_text,fragment", [
    ("program: fake_train.py\nmethod: bayes\nparameters: {learning_rate: {values: [1]}}\n", "bayes"),
    ("program: fake_train.py\nmethod: hyperopt\nparameters: {learning_rate: {values: [1]}}\n", "unknown method 'hyperopt'"),
    ("program: fake_train.py\nmethod: grid\nparameters: {learnin_rate: {values: [0.1]}}\n", "learnin_rate"),
    ("program: fake_train.py\nmethod: grid\nparameters: {opt: {parameters: {lr: {value: 1}}}}\n", "nested"),
    ("program: fake_train.py\nmethod: grid\nparameters: {learning_rate: {min: 0.1, max: 1.0}}\n", "grid needs values"),
    ("program: fake_train.py\nmethod: random\nparameters: {learning_rate: {min: 0.1, max: 1.0}}\n", "--count"),
    ("program: fake_train.py\nmethod: grid\nparameters: {batch_size: {values: [x]}}\n", "batch_size"),
    ("program: fake_train.py\nmethod: grid\nparameters: {batch_size: {values: [1]}}\ncommand: ['${program}', '${argz}']\n", "${argz}"),
    ("program: fake_train.py\nmethod: grid\nparameters: {lr: {distribution: betaa, min: 0, max: 1}}\n", "betaa"),
    ("method: grid\nparameters: {lr: {values: [1]}}\n", "program"),
    ("program: fake_train.py\nmethod: [grid\n", "not valid YAML"),
])
def test_bad_sweep_files_are_one_line_errors(tmp_path, yaml_text, fragment):
    wd = fake_workdir(tmp_path, "")
    (wd / "s.yaml").write_text(yaml_text)
    proc = run_sweep(wd, "--dry_run")
    assert_one_line_error(proc, fragment)
    assert not (wd / "out").exists()


# ---------------------------------------------------------------------- the repository's sweeps

def test_repository_sweeps_match_train_config_keys():
    """Every sweeps/*.yaml expands, against train.py's real schema and config files."""
    files = sorted(glob.glob(os.path.join(REPO, "sweeps", "*.yaml")))
    assert files, "no sweeps/*.yaml"
    for path in files:
        proc = run_main("sweep.py", [path, "--dry_run"], cwd=REPO)
        assert proc.returncode == 0, proc.stderr
        commands = [l for l in proc.stdout.splitlines() if l and not l.startswith("#")]
        assert commands and all(c.startswith("/usr/bin/env python train.py ") for c in commands)
        # the sweeps' out_dir templates keep runs apart: no run needed an out/sweeps/ folder of its own
        assert "share out_dir" not in proc.stderr and "out/sweeps/" not in proc.stdout
    deletion = run_main("sweep.py", [os.path.join(REPO, "sweeps", "deletion.yaml"), "--dry_run"], cwd=REPO).stdout
    assert len([l for l in deletion.splitlines() if l.startswith("/usr/bin/env")]) == 24


def test_the_drivers_keys_come_from_the_caller(capsys):
    """The runner takes the repository's drivers' schemas from its caller (sweep.py passes
    schema.py's): given them, train.py's keys are TRAIN's; without them train.py is read
    statically like any program, and its SCHEMA, built only when it runs, leaves it unchecked."""
    assert runner.program_schema("train.py", REPO, {"train.py": TRAIN}) is TRAIN
    assert runner.program_schema("train.py", REPO, {}) is None
    assert "builds its SCHEMA when it runs" in capsys.readouterr().err
