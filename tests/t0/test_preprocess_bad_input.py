"""Bad input to `finetune_t0.py --preprocess` with Megatron's preprocess_data.py flags: one `error:`
line, exit 2, nothing written or changed (tests/test_bad_input.py's style)."""
import pytest
from conftest import run_main
from test_bad_input import assert_error, assert_nothing_lost, snapshot
from test_t0_preprocess import hf, pass_argv  # noqa: F401  (the module fixture)


def no_eos_folder(h, root):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(h["small"])
    tok.eos_token = None
    tok.save_pretrained(str(root))
    return str(root)


CASES = {
    "json-key-text": (lambda h, t: pass_argv(h, t / "p", "text"), ["--json-keys text", "inputs and/or targets"]),
    "json-key-twice": (lambda h, t: pass_argv(h, t / "p", "inputs") + ["--json-keys", "inputs", "inputs"],
                       ["each once"]),
    "dataset-impl-lazy": (lambda h, t: pass_argv(h, t / "p", "inputs") + ["--dataset-impl", "lazy"],
                          ["--dataset-impl lazy", "only mmap"]),
    "workers-0": (lambda h, t: pass_argv(h, t / "p", "inputs") + ["--workers", "0"], ["workers", "[1, inf)"]),
    "eod-without-hf": (lambda h, t: ["--preprocess", "--input", h["data"], "--output-prefix", str(t / "p"),
                                      "--tokenizer_model=x.model", "--append-eod"],
                       ["--append-eod", "go with --tokenizer-name-or-path"]),
    "two-tokenizers": (lambda h, t: pass_argv(h, t / "p", "inputs") + ["--model_dir=somewhere"],
                       ["one tokenizer", "not both"]),
    "not-preprocess": (lambda h, t: ["--model_dir=m", "--json-key", "inputs", "--append-eod"],
                       ["--json_keys, --append_eod", "for --preprocess"]),
    "tokenizer-not-a-folder": (lambda h, t: pass_argv(h, t / "p", "inputs", tok="data"),
                               ["--tokenizer-name-or-path", "not a folder"]),
    "no-eos-token": (lambda h, t: pass_argv(dict(h, none=no_eos_folder(h, t / "noeos")), t / "p", "targets",
                                             "--append-eod", tok="none"), ["--append-eod", "has no eos token"]),
    "foreign-file": (lambda h, t: (t / "p_targets_document.bin").write_text('{"mine": 1}\n') and
                     pass_argv(h, t / "p", "targets", "--overwrite=True"), ["p_targets_document.bin", "never replaced"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_bad_preprocess_input(hf, tmp_path, name):  # noqa: F811
    make, fragments = CASES[name]
    argv = [str(a) for a in make(hf, tmp_path)]
    before = snapshot(tmp_path)
    proc = run_main("finetune_t0.py", argv, cwd=str(tmp_path))
    assert_error(proc, 2, *fragments)
    assert_nothing_lost(before, snapshot(tmp_path), nothing_new=True)
