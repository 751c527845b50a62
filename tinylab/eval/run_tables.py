"""The generation tables a training run already logged, read back to be scored after the fact,
and the score written back to the same run (evaluation/eval_features.py --tables).

train.py logs each generation evaluation (tinylab/eval/lm_eval.py) as
    metrics.jsonl   a record {"iter", "kind": "table", "generations/<name>": [{prefix, clean_prefix,
                    generation, target, iter_num}, ...]} per dataset (metrics.MetricsLogger.log_table)
    wandb           a wandb.Table under the key generations/<name>, which wandb stores as a
                    `run_table` artifact run-<run id>-generations<name>:v<k> (the "/" dropped)
The study's wandb_generation_classification.py read those artifacts with wandb.Api() and logged
the score back by resuming the run (wandb.init(id=..., resume="must")); WandbRun does the same.
A local log gets one new record per scored evaluation, appended atomically under the run
folder's lock (a run still training in it is refused).
"""
import json
import os
import re
import tempfile

from tinylab.core.errors import UserError, first_line
from tinylab.core.metrics import append_records, read_metrics
from tinylab.core.rundir import LOCK_NAME, RunDir
from tinylab.data.template import story_end

COLUMNS = ["prefix", "clean_prefix", "generation", "target", "iter_num"]
PREFIX = "generations/"
# ENTITY/PROJECT/RUN_ID, ENTITY/PROJECT/runs/RUN_ID, or the run page's URL
WANDB_PATH = re.compile(r"(?:wandb:|https?://[^/]+/)?([\w.-]+)/([\w.-]+)/(?:runs/)?([\w-]+)/?")


def _rows(table, where):
    """Rows as lists in COLUMNS order (FeatureScore's), the story cut at the next example."""
    rows = []
    for r in table:
        if not isinstance(r, dict) or not all(isinstance(r.get(c), str) for c in ("prefix", "generation")):
            raise UserError(f"{where}: a generation table row is not a {{prefix, generation, ...}} record")
        g = r["generation"]
        rows.append([r["prefix"], r.get("clean_prefix", r["prefix"].strip()), g[:story_end(g)].strip(),
                     r.get("target", ""), r.get("iter_num")])
    return rows


class LocalRun:
    """A run folder's metrics.jsonl (or the file itself)."""

    kind = "local"

    def __init__(self, path):
        self.path = os.path.join(path, "metrics.jsonl") if os.path.isdir(path) else path
        self.where = self.path
        if not os.path.isfile(self.path):
            raise UserError(f"--tables={path}: no metrics.jsonl there")
        self.folder = os.path.dirname(os.path.abspath(self.path))
        self.tables = {}  # {iter: {dataset: rows}}
        for rec in read_metrics(self.path):
            if rec.get("kind") != "table":
                continue
            for k, v in rec.items():
                if k.startswith(PREFIX) and isinstance(v, list):
                    self.tables.setdefault(rec.get("iter"), {})[k[len(PREFIX):]] = _rows(v, self.path)
        self.config = {}
        config = os.path.join(self.folder, "config.json")
        if os.path.isfile(config):
            try:
                with open(config, encoding="utf-8") as f:
                    self.config = json.load(f)
            except ValueError:
                pass  # only the data cache is read from it; --data_cache_dir can say it instead

    def write(self, records):
        records = [{"iter": r["iter"], "kind": "feature_score", **r} for r in records]
        # a run folder is locked by its training run while it runs: take the lock for the rewrite
        if os.path.exists(os.path.join(self.folder, LOCK_NAME)):
            with RunDir(self.folder, what="run folder"):
                append_records(self.path, records)
        else:
            append_records(self.path, records)
        print(f"appended {len(records)} record(s) to {self.path}")


class WandbRun:
    """A wandb run, read through wandb.Api(); `api` replaces it (tests)."""

    kind = "wandb"

    def __init__(self, path, api=None):
        wandb = _wandb()
        try:
            api = api or wandb.Api()
            self.run = api.run(path)
        except Exception as e:  # noqa: BLE001  no login, no network, no such run: the API's many kinds
            raise UserError(f"--tables={path}: cannot read that wandb run ({first_line(e, 120)}); it is neither a "
                            f"local metrics.jsonl nor a readable ENTITY/PROJECT/RUN_ID") from None
        run = self.run
        self.where = f"wandb run {run.entity}/{run.project}/{run.id}"
        self.config = dict(run.config or {})
        name = re.compile(rf"run-{re.escape(run.id)}-generations(.+):v\d+")
        self.tables = {}
        with tempfile.TemporaryDirectory() as tmp:  # downloads go nowhere the user keeps
            for art in run.logged_artifacts():
                m = name.fullmatch(art.name)
                if art.type != "run_table" or not m:
                    continue
                try:
                    with open(art.file(os.path.join(tmp, art.name.replace(":", "_")))) as f:
                        data = json.load(f)
                    table = [dict(zip(data["columns"], r)) for r in data["data"]]
                except Exception as e:  # noqa: BLE001  a download or a file that is not a table
                    raise UserError(f"{self.where}: table {art.name} cannot be read ({first_line(e, 120)})") from None
                for row in _rows(table, f"{self.where} {art.name}"):
                    self.tables.setdefault(row[4], {}).setdefault(m.group(1), []).append(row)

    def write(self, records):
        """Log each record's numbers to the run, resumed, with `iter_num_gen` as its iteration
        (the study's script: a resumed run cannot log at steps it has passed)."""
        wandb = _wandb()
        run = self.run
        try:
            live = wandb.init(entity=run.entity, project=run.project, id=run.id, resume="must")
            for r in records:
                live.log({"iter_num_gen": r["iter"], **{k: v for k, v in r.items() if k != "iter"
                                                        and isinstance(v, (int, float)) and not isinstance(v, bool)}})
            live.finish()
        except Exception as e:  # noqa: BLE001  wandb's failures have many kinds; the scores are printed anyway
            raise UserError(f"could not log the scores to {self.where} ({first_line(e, 120)})") from None
        print(f"logged {len(records)} score(s) to {self.where} (x-axis iter_num_gen)")


def _wandb():
    try:
        import wandb
    except ImportError:
        raise UserError("a wandb run path needs the wandb package (pip install wandb)") from None
    return wandb


def open_run(spec: str, api=None):
    """LocalRun for an existing file or folder (or a *.jsonl path), else WandbRun for a run path;
    UserError when the run logged no generation tables."""
    if os.path.exists(spec) or spec.endswith(".jsonl"):
        run = LocalRun(spec)
    elif WANDB_PATH.fullmatch(spec):
        run = WandbRun("/".join(WANDB_PATH.fullmatch(spec).groups()), api)
    else:
        raise UserError(f"--tables={spec}: no such file or folder, and not a wandb run path ENTITY/PROJECT/RUN_ID")
    if not run.tables:
        raise UserError(f"{run.where} has no generation tables (train.py logs them with max_new_tokens > 0; "
                        f"'generations/<name>' tables)")
    return run
