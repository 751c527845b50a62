"""One rank's part of several runs in a row (conftest.run_ranks with more than one run).

    python tests/rank_runs.py '<json list of argvs>' '<json list of ports>'

Each argv starts with an entry script ("train.py", "finetune_t0.py"); its main(argv) is called
behind the command line's error boundary (errors.cli_main), one run after the other, in this one
process, as conftest.run_main calls it in a test worker. Every run sets up and tears down its own
process group, on a rendezvous port of its own (MASTER_PORT), so that no rank can meet another's
previous run. What this spares is the interpreter start and the imports of every run after the
first (about 3 s of CPU per rank and run). The process exits with the first failing run's code;
the runs after it are not started.
"""
import importlib
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from tinylab.core.errors import cli_main  # noqa: E402


def run_all(runs, ports):
    for argv, port in zip(runs, ports, strict=True):
        os.environ["MASTER_PORT"] = str(port)
        module = importlib.import_module(argv[0][:-3].replace("/", "."))
        sys.argv = list(argv)  # argparse names the script in its messages
        try:
            cli_main(module.main, list(argv[1:]))
        except SystemExit as e:
            if e.code not in (None, 0):
                raise
    return 0


if __name__ == "__main__":
    sys.exit(run_all(json.loads(sys.argv[1]), json.loads(sys.argv[2])))
