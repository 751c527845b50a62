"""metrics.py: metrics.jsonl records and what reaches wandb (a fake wandb module records calls)."""
import sys
import types

from conftest import read_metrics

from tinylab.core.metrics import MetricsLogger
from tinylab.core.run_keys import WandbOptions


def test_records_and_wandb_payload(tmp_path, monkeypatch):
    calls = []
    fake = types.SimpleNamespace(init=lambda **kw: calls.append(("init", kw)),
                                 log=lambda data, step: calls.append(("log", data, step)))
    monkeypatch.setitem(sys.modules, "wandb", fake)
    options = WandbOptions(log=True, project="p", run_name="", entity="", tags=["a"], mode="")
    logger = MetricsLogger(str(tmp_path), {"seed": 1}, options)
    logger.log({"iter": 3, "loss/test": 1.5, "gen_feature_judge": "classifier (held-out acc 1.000)",
                "gen_feature_judge_accuracy": 1.0, "flag": True, "table": [1, 2], "nan": float("nan")}, kind="eval")
    logger.close()
    rows = read_metrics(str(tmp_path / "metrics.jsonl"))
    assert rows[0]["iter"] == 3 and rows[0]["kind"] == "eval" and rows[0]["gen_feature_judge"].startswith("classifier")
    assert calls[0][0] == "init" and calls[0][1]["tags"] == ["a"] and calls[0][1]["project"] == "p"
    assert calls[0][1]["config"] == {"seed": 1} and "mode" not in calls[0][1]  # the run's record; '' = wandb's mode
    # numbers and texts go to wandb (the judge's name beside its score); bools, lists, bookkeeping do not
    assert calls[1] == ("log", {"iter": 3, "loss/test": 1.5, "gen_feature_judge": "classifier (held-out acc 1.000)",
                                "gen_feature_judge_accuracy": 1.0, "nan": calls[1][1]["nan"]}, 3)
    assert calls[1][1]["nan"] != calls[1][1]["nan"]  # a float nan, as logged, not the JSON file's "nan"
