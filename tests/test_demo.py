"""The README Quickstart's main command (demo.sh), shortened: small corpus, few iterations."""
import os
import re
import subprocess

import pytest
from conftest import PYTHON, REPO


def readme_commands():
    text = open(os.path.join(REPO, "README.md")).read()
    quick = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```\n(.*?)\n```", quick, flags=re.S)


def test_readme_quickstart_has_exactly_two_commands():
    cmds = readme_commands()
    assert len(cmds) == 2 and all("\n" not in c for c in cmds)
    assert cmds[0].endswith("bash demo.sh") and "requirements.txt" in cmds[0]
    assert "pytest" in cmds[1] and "requirements-dev.txt" in cmds[1]
    ci = open(os.path.join(REPO, ".ci", "run")).read()
    assert cmds[1] in ci  # CI runs exactly the README's test command


@pytest.mark.slow
def test_demo_runs_end_to_end(tmp_path):
    env = dict(os.environ, PYTHON=PYTHON, DATA=str(tmp_path / "data"), OUT=str(tmp_path / "out"), DEMO_SHARDS="2",
               DEMO_STORIES="300", DEMO_SAMPLE_TOKENS="48", WANDB_MODE="disabled")
    proc = subprocess.run(["bash", "demo.sh", "--max_iters=4", "--warmup_iters=2", "--eval_interval=4", "--eval_iters=1",
                           "--max_new_tokens=8", "--batch_size=4", "--gradient_accumulation_steps=1"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = proc.stdout.split("=== a story sampled from", 1)[1]
    assert "Story:" in out and "Features: Dialogue, Twist" in out
    assert os.path.exists(tmp_path / "out" / "ckpt.pt")
