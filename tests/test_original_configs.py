"""The original study's 13 config files (configs/, copied with their values; paths relative) each
run train.py end to end on a tiny corpus that holds every dataset they name (built here from
the names: tw_fs.sh family names and the older automatic spec strings), with tiny overrides
of the model size, batch sizes and lengths (the warmup's too) only. The probe config logs the original's probe
metrics; the same config with lenses=True the lens metrics."""
import json
import os
import re
import shutil

import pytest
from conftest import REPO, TOK8192, records, run_main, save_tiny_checkpoint, tiny_model

from tinylab.data.dataset_spec import infer_pretokenize_flags, parse_spec
from tinylab.schema import TRAIN

ORIGINAL = ["base8M", "base30M", "base91M", "base210M", "base91M_fs_delete", "base91M_fs_recover", "base91M_tw_delete",
            "base91M_tw_recover", "base91M_tw_delete_aws", "base91M_tw_recover_aws", "base91M_tw_probe_aws",
            "base91M_tw_delete_no_lrs", "base91M_tw_recover_no_lrs"]


def config_path(name):
    return os.path.join(REPO, "configs", f"{name}.py")


def parsed(name):
    # the probe config names no model_dir; the run name's timestamp is the time of parsing
    return TRAIN.parse([config_path(name), "--model_dir=base", "--wandb_run_name=run"])


@pytest.fixture(scope="module")
def corpus(tiny_corpus, tmp_path_factory):
    """tiny_corpus's raw shards with every dataset the 13 configs name, and a tiny base model."""
    from tinylab.data.pretokenize import pretokenize
    cache = str(tmp_path_factory.mktemp("original_configs"))
    os.symlink(tiny_corpus.raw_dir, os.path.join(cache, "TinyStories_all_data"))
    shutil.copy(TOK8192, os.path.join(cache, "tok8192.model"))
    names = sorted({n for c in ORIGINAL for n in [parsed(c)["dataset_name"], *parsed(c)["eval_dataset_names"]]})
    assert len(names) == 13  # the default one, the first-generation F_... names and the tw_fs.sh family's
    for name in names:
        flags = infer_pretokenize_flags(name)
        assert flags is not None, name  # the name says how to build it
        spec = parse_spec(**{f[2:].split("=", 1)[0]: f.split("=", 1)[1] for f in flags})
        pretokenize(cache, 8192, spec, dataset_name=name, seed=0, workers=1)
    base = os.path.join(cache, "base")
    save_tiny_checkpoint(os.path.join(base, "ckpt.pt"), tiny_model(max_seq_len=128), cache_dir=cache)
    return cache, base


def tiny_overrides(corpus, out_dir):
    cache, base = corpus
    return dict(data_cache_dir=cache, out_dir=out_dir, model_dir=base, dim=32, n_layers=2, n_heads=4, n_kv_heads=2,
                multiple_of=16, max_seq_len=128, max_iters=2, warmup_iters=1, batch_size=2, eval_iters=1, eval_batch_size=2,
                generation_batch_size=2, max_new_tokens=4, device="cpu", dtype="float32")


@pytest.mark.slow
@pytest.mark.parametrize("name", ORIGINAL)
def test_original_config_runs(corpus, tmp_path, name):
    cfg = parsed(name)
    assert cfg["wandb_project"] == "tinystories-uft" and cfg["wandb_entity"] == "ucl-dark" and cfg["wandb_log"]
    stamped = TRAIN.parse([config_path(name), "--model_dir=base"])["out_dir"]
    assert re.fullmatch(r"data/base\d+M-(train|delete|recover|probe)-[0-9_]+/out", stamped), stamped
    out = str(tmp_path / "run")
    over = dict(tiny_overrides(corpus, out), wandb_run_name="run")
    proc = run_main("train.py", [config_path(name)] + [f"--{k}={v}" for k, v in over.items()])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    # every value the config sets and the test does not override is what the run used (but the
    # run name's timestamp)
    used = json.load(open(os.path.join(out, "config.json")))
    assert {k: v for k, v in used.items() if k not in over} == {k: v for k, v in cfg.items() if k not in over}
    evals = records(out, "eval")
    assert [r["iter"] for r in evals] == [0, 2]
    keys = ["train", "test", *cfg["eval_dataset_names"]]
    tables = records(out, "table")
    if cfg["probes"]:
        names = {f"loss/{k}" for k in keys} | {f"{m}/{k}/probe_0" for m in ("loss", "acc") for k in keys}
        names |= {f"acc/{k}/feat_{j}/probe_0" for k in keys for j in range(6)}
        assert all(set(r) - {"iter", "kind", "time", "best_val_loss"} == names for r in evals)
        assert not tables
    else:
        assert all({f"loss/{k}" for k in keys} <= set(r) for r in evals)
        assert {t for r in tables for t in r if t.startswith("generations/")} == \
            {"generations/id", *[f"generations/{k}" for k in cfg["eval_dataset_names"]]}


@pytest.mark.slow
def test_probe_config_with_lenses(corpus, tmp_path):
    out = str(tmp_path / "run")
    over = dict(tiny_overrides(corpus, out), probes=False, lenses=True, init_lens_with_unembed=True)
    run_main("train.py", [config_path("base91M_tw_probe_aws")] + [f"--{k}={v}" for k, v in over.items()], check=True)
    names = {f"loss/{k}{p}" for k in ("train", "test") for p in ("", "/probe_0", "/probe_1")}
    assert all(set(r) - {"iter", "kind", "time", "best_val_loss"} == names for r in records(out, "eval"))
    assert not records(out, "table")  # the config's generation_eval_iters=0: no generations


def test_recovery_alias_is_the_recover_config():
    alias, recover = parsed("base91M_tw_recovery_no_lrs"), parsed("base91M_tw_recover_no_lrs")
    alias.pop("out_dir"), recover.pop("out_dir")  # timestamped when parsed
    assert alias == recover
