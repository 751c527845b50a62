"""Run logging: `out_dir/metrics.jsonl` always, wandb when asked.

Every logged record is one JSON object per line with at least `iter` and `kind` ("train" for
per-iteration lines, "eval" for evaluations, "growth", "event"...), so any run can be read and
plotted without a wandb account. wandb is optional: if it is missing, offline, or fails to start,
training goes on with a warning (WANDB_MODE=offline / disabled are honoured). A resumed run passes
the wandb run id its checkpoint recorded (`wandb_run_id`), and wandb.init continues that run
(resume="allow": also an offline run that was never synced, which "must" would refuse).
"""
import json
import math
import os
import sys
import time

from tinylab.core.fileio import write_atomic


def _jsonable(v):
    if hasattr(v, "item") and getattr(v, "ndim", 1) == 0:
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)  # JSON has no NaN/inf; keep them readable
    return v


def read_metrics(path, notice=True):
    """All records of a metrics.jsonl file. A torn last line (a crash mid-write) is skipped
    silently; other lines that are not UTF-8 JSON objects are skipped with one notice line."""
    rows, skipped = [], 0
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    torn = lines.pop()  # after the last newline: empty, or a write cut short by a crash (no notice)
    for raw in lines + [torn]:
        if not raw.strip():
            continue
        try:
            row = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            skipped += raw is not torn
            continue
        if isinstance(row, dict):
            rows.append(row)
        else:
            skipped += 1
    if skipped and notice:
        print(f"notice: skipped {skipped} unreadable line(s) of {path}", file=sys.stderr)
    return rows


def truncate_metrics(path, before_iter):
    """On resume: drop records at or after the resumed iteration, which the resumed run redoes.
    Rewritten atomically (a full disk leaves the old file)."""
    if not os.path.exists(path):
        return
    keep = [r for r in read_metrics(path) if isinstance(r.get("iter"), (int, float)) and r["iter"] < before_iter]
    write_atomic(path, "".join(json.dumps(r) + "\n" for r in keep).encode())


def append_records(path, records):
    """Add records to the end of an existing metrics.jsonl (a scorer run after training): the file
    is rewritten through a temp file, so a crash leaves the old one, never a half-written line.
    (The caller holds the run folder's lock: a rename under a live writer would lose its lines.)"""
    with open(path, "rb") as f:
        data = f.read()
    if data and not data.endswith(b"\n"):
        data += b"\n"  # a torn last line stays a line of its own (read_metrics skips it)
    lines = [json.dumps({"iter": r.get("iter"), **{k: _jsonable(v) for k, v in r.items() if k != "iter"}}) + "\n"
             for r in records]
    write_atomic(path, data + "".join(lines).encode())


class MetricsLogger:
    """metrics.jsonl in `out_dir`, and wandb when `wandb` (core/run_keys.WandbOptions) says so;
    `config` is the run's resolved config, the record wandb shows beside the run."""

    def __init__(self, out_dir, config, wandb=None, enabled=True, resume_iter=None, wandb_run_id=None):
        self.enabled = enabled
        self.path = os.path.join(out_dir, "metrics.jsonl")
        self.wandb = None
        self.wandb_run_id = wandb_run_id  # the run's id once wandb has started (checkpoints store it)
        if not enabled:
            return
        os.makedirs(out_dir, exist_ok=True)
        if resume_iter is not None:
            truncate_metrics(self.path, resume_iter)
        self.file = open(self.path, "a")
        if wandb is not None and wandb.log:
            self._start_wandb(wandb, config)

    def _start_wandb(self, options, config):
        try:
            import wandb
        except ImportError:
            print("warning: wandb_log=True but wandb is not installed; logging to metrics.jsonl only", file=sys.stderr)
            return
        kwargs = dict(project=options.project or None, name=options.run_name or None, entity=options.entity or None,
                      tags=list(options.tags or []) or None, config=config, dir=os.path.dirname(self.path))
        if options.mode:
            kwargs["mode"] = options.mode
        if self.wandb_run_id:
            kwargs.update(id=self.wandb_run_id, resume="allow")
        try:
            self.wandb = wandb
            self.run = wandb.init(**kwargs)
            self.wandb_run_id = getattr(self.run, "id", None) or self.wandb_run_id
        except Exception as e:  # no server, no login, ...: never let wandb stop training
            print(f"warning: wandb could not start ({type(e).__name__}: {e}); logging to metrics.jsonl only", file=sys.stderr)
            self.wandb = None

    def log(self, record: dict, kind="train", wandb_prefix_map=None):
        """Append one record; also send numbers and short texts (e.g. the feature judge's name)
        to wandb (optionally renaming keys)."""
        if not self.enabled:
            return
        line = {"iter": record.get("iter"), "kind": kind, **{k: _jsonable(v) for k, v in record.items() if k != "iter"}}
        line.setdefault("time", time.time())
        self.file.write(json.dumps(line) + "\n")
        self.file.flush()
        if self.wandb is not None:
            data = {}
            for k, v in record.items():  # the original values: a nan stays a float for wandb
                if k == "time" or not isinstance(v, (int, float, str)) or isinstance(v, bool):
                    continue
                data[(wandb_prefix_map or {}).get(k, k)] = v
            self._wandb_call(lambda: self.wandb.log(data, step=line["iter"]))

    def log_table(self, name, columns, rows, iter_num):
        """A table (e.g. generations): one metrics.jsonl record holding the rows, a wandb.Table."""
        if not self.enabled:
            return
        self.log({"iter": iter_num, name: [dict(zip(columns, r)) for r in rows]}, kind="table")
        if self.wandb is not None:
            self._wandb_call(lambda: self.wandb.log({name: self.wandb.Table(columns=columns, data=rows)}, step=iter_num))

    def _wandb_call(self, fn):
        try:
            fn()
        except Exception as e:
            print(f"warning: wandb logging failed ({type(e).__name__}: {e}); continuing without wandb", file=sys.stderr)
            self.wandb = None

    def close(self):
        if not self.enabled:
            return
        self.file.close()
        if self.wandb is not None:
            self._wandb_call(lambda: self.wandb.finish())
