"""Run a wandb sweep YAML locally, one run after another, with no wandb server.

    python sweep.py sweeps/deletion.yaml                 # every grid point
    python sweep.py sweeps/x.yaml --count=8 --seed=0     # method: random, 8 seeded draws
    python sweep.py sweeps/x.yaml --dry_run              # print the commands, run nothing
    python sweep.py sweeps/x.yaml --wandb_mode=disabled --parallel=2

`wandb agent` cannot run a sweep without the W&B backend (even its "local controller" talks to
it), so this reads the same YAML (docs/interop.md) and does the agent's job:
  - grid: the Cartesian product of every parameter's `values` (a `value` is one value), in YAML
    order, the first parameter varying slowest; random: independent draws from each parameter's
    distribution with a seeded RNG, `--count` or `run_cap` of them; bayes needs the server: error;
  - every parameter must be a config key of the program and every value must pass the
    configurator, checked for all runs before the first one starts. The keys are read without
    running the program: train.py's and finetune_t0.py's from tinylab/schema.py, any other
    program's from its source (a module-level DEFAULTS dict, or its module-level assignments of
    literals, as nanoGPT-style configurator programs declare them); a program whose SCHEMA only
    running it builds is not checked (a notice says so);
  - the command is built exactly as `wandb agent` builds it (wandb_agent.py, `_command_run`):
    `${envvar:NAME}` inside any item, then items that are a whole macro (`${env}`, `${interpreter}`,
    `${program}`, `${args}`, `${args_no_equals}`, `${args_no_hyphens}`, `${args_no_boolean_flags}`,
    `${args_json}`, `${args_json_file}`) replaced by their argument lists; no shell;
  - each run's out_dir is what the program will compute from that argv (the configurator, config
    files and `{key}` templates included); only if two runs would share one out_dir, and so
    overwrite each other's checkpoints and metrics, is `--out_dir=<sweep folder>/run-NNN` appended
    to every command (the one possible difference from the agent's argv, announced on stderr);
  - each run starts from the repository root with WANDB_MODE=offline (or --wandb_mode), and the
    folder of this Python first on PATH so that the agent's `python` is this interpreter;
  - results.jsonl in the sweep folder gets one line per run: params, argv, exit code, and the final
    and best (per metric.goal) value of metric.name from the run's metrics.jsonl; configurations
    already recorded with exit code 0 are skipped when the sweep is started again;
  - a sweep with failed runs ends with `error: N run(s) failed: <runs> (logs in <sweep folder>)`
    and exit 1; Ctrl-C passes one SIGINT to the runs in progress (train.py saves a checkpoint),
    waits for them, starts no other run and ends with `error: interrupted`, exit 130.
"""
from tinylab.core.config import ArgParser
from tinylab.core.errors import UserError, cli_main
from tinylab.interop.sweeps import REPO, run_sweep
from tinylab.schema import DRIVERS  # this repository's programs, whose keys a sweep is checked against


def main(argv=None):
    ap = ArgParser(description="Run a wandb sweep YAML locally (grid or random), one run after another.")
    ap.add_input("sweep", help="the sweep YAML")
    ap.add_argument("--count", type=int, help="number of runs (random: required unless run_cap; grid: the first N)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random draws")
    ap.add_argument("--dry_run", action="store_true", help="print the commands and exit")
    ap.add_output("--out_dir", kind="sweep", help="sweep folder for results.jsonl, logs and run outputs "
                                      "(default: out/sweeps/<yaml name>, under the working directory)")
    ap.add_argument("--wandb_mode", default="offline", choices=("offline", "disabled", "online"),
                    help="WANDB_MODE of the runs (offline: sync later with `wandb sync`)")
    ap.add_argument("--parallel", type=int, default=1, help="runs at a time (output then only in the run logs)")
    ap.add_argument("--workdir", default=REPO, help="where the runs start and `program` is found (default: the repository)")
    a = ap.parse_args(argv)
    if a.count is not None and a.count < 1:
        raise UserError(f"--count must be at least 1, not {a.count}")
    if a.parallel < 1:
        raise UserError(f"--parallel must be at least 1, not {a.parallel}")

    run_sweep(a.sweep, a.count, a.seed, a.dry_run, a.out_dir, a.wandb_mode, a.parallel, a.workdir, drivers=DRIVERS)


if __name__ == "__main__":
    cli_main(main)
