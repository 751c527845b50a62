"""Move models between tinystories-lab and other tools.

    python export.py out/model.bin --version=0 --checkpoint=out/ckpt.pt   # llama2.c run.c (legacy)
    python export.py out/model.bin --version=1 --checkpoint=out/ckpt.pt   # llama2.c fp32 + header
    python export.py out/model.bin --version=2 --checkpoint=out/ckpt.pt   # llama2.c runq.c, int8 Q8_0
    python export.py out/hf --version=-1 --checkpoint=out/ckpt.pt [--tokenizer=tok.model]  # HF Llama dir (+ AutoTokenizer)
    python export.py --tokenizer=tokenizers/tok8192.model out/tok8192.bin  # run.c tokenizer .bin
    python export.py out/imported --import_hf=path/to/hf_llama_dir        # HF Llama -> ckpt.pt
    python export.py out/imported --import_bin=model.bin                  # llama2.c .bin -> ckpt.pt

The formats (docs/interop.md) are tinylab/interop/llama2c.py's (.bin files) and hf.py's (HF folders).
Two layouts of the same network meet there: llama2.c/Meta rotate adjacent pairs (2i, 2i+1) of each
head, HF rotates (i, i + head_dim/2); the rows of wq and wk are permuted per head on the way to HF
and back on the way in.

An import output ending in .pt is the checkpoint file; anything else is a folder that gets ckpt.pt,
which is what `train.py --init_from=resume_model --model_dir=DIR` reads.
Every output is written under a temporary name and renamed, so a failure leaves nothing half-written.
An existing output is replaced only with --force, and an import never replaces a training checkpoint.
"""
import os

from tinylab.core.checkpoint import load_checkpoint, model_from_checkpoint, save_checkpoint
from tinylab.core.config import Key, Schema
from tinylab.core.errors import UserError, cli_main
from tinylab.core.outputs import declared_inputs, guard_file, guard_folder
from tinylab.interop.hf import export_hf, import_output_path, imported_checkpoint, read_hf
from tinylab.interop.llama2c import export_bin, export_tokenizer, read_bin

SCHEMA = Schema("export.py", [("export / import", [
    Key("version", None, "format of a --checkpoint export: 0 (default), 1, 2 = llama2.c .bin (2 = int8 Q8_0); "
        "-1 = HF Llama folder. Refused in other modes", type=int, choices=(-1, 0, 1, 2)),
    Key("checkpoint", None, "our checkpoint (ckpt.pt or its folder) to export", type=str, nonempty=True, input=True),
    Key("tokenizer", None, "sentencepiece .model: alone, write run.c's tokenizer .bin; with --version=-1, add it to "
        "the HF folder (with the tokenizer.json AutoTokenizer loads); with a .bin export, write tokenizer.bin beside it",
        type=str, nonempty=True, input=True),
    Key("group_size", None, "Q8_0 group size for --version=2 (default 64, halved until it divides dim); refused "
        "with other versions", type=int, range="[1, inf)"),
    Key("import_hf", None, "HF LlamaForCausalLM folder to import as our checkpoint", type=str, nonempty=True,
        input=True),
    Key("import_bin", None, "llama2.c model .bin (v0/v1/v2) to import as our checkpoint", type=str, nonempty=True,
        input=True),
    Key("force", False, "replace an existing output of the same kind (never the input, a training checkpoint or a "
        "run's files; an HF folder is moved aside)"),
])])


def main(argv=None):
    ap = SCHEMA.argparser("Export a checkpoint to llama2.c .bin (v0/v1/v2) or a Hugging Face Llama folder, "
                          "write a run.c tokenizer .bin, or import an HF / llama2.c model as a checkpoint.")
    # the output's kind depends on the mode, so it is guarded below (outputs.py), before any work
    ap.add_output("filepath", nargs="?", help="output: .bin file, HF folder, tokenizer .bin, or imported checkpoint "
                                              "(.pt file, or a folder that gets ckpt.pt)")
    a = SCHEMA.parse_args(argv, ap)
    inputs = declared_inputs(SCHEMA, vars(a))  # never replaced by an output (outputs.py)

    # --version is checked first, in every mode: a flag that does nothing must not pass silently
    if a.version is not None and a.checkpoint is None:
        raise UserError(f"--version={a.version} applies only to a --checkpoint export (an import reads the format from "
                        f"its input; the tokenizer .bin has a single format)")
    version = 0 if a.version is None else a.version
    if a.group_size is not None and version != 2:
        raise UserError(f"--group_size={a.group_size} applies only to --version=2 (int8 Q8_0) exports")
    group_size = 64 if a.group_size is None else a.group_size

    if a.import_hf or a.import_bin:
        if a.import_hf and a.import_bin or a.checkpoint:
            raise UserError("give one of --import_hf, --import_bin or --checkpoint")
        if not a.filepath:
            raise UserError("an import needs the output path (a .pt file, or a folder that gets ckpt.pt)")
        out = guard_file(import_output_path(a.filepath), "checkpoint", a.force, inputs, "import output")
        args, state = read_hf(a.import_hf) if a.import_hf else read_bin(a.import_bin)
        source = f"hf:{a.import_hf}" if a.import_hf else f"llama2.c:{a.import_bin}"
        save_checkpoint(imported_checkpoint(args, state, source), out)
        print(f"wrote {out} (imported from {source}; dim={args.dim}, n_layers={args.n_layers}, n_heads={args.n_heads}, "
              f"n_kv_heads={args.kv_heads()}, vocab_size={args.vocab_size}, tied={args.tie_embeddings})")
        return

    if a.checkpoint is None:
        if a.tokenizer is None:
            raise UserError("nothing to do: give --checkpoint, --tokenizer, --import_hf or --import_bin")
        out = guard_file(a.filepath or os.path.splitext(a.tokenizer)[0] + ".bin", "tokenizer_bin", a.force, inputs,
                         "tokenizer output")
        export_tokenizer(a.tokenizer, out)
        return
    if not a.filepath:
        raise UserError("missing the output path (first argument)")
    if version == -1:
        guard_folder(a.filepath, "hf_folder", a.force, inputs, "HF export folder")
    else:
        guard_file(a.filepath, "llama2c_bin", a.force, inputs, "export")
        if a.tokenizer:
            tok_out = os.path.join(os.path.dirname(os.path.abspath(a.filepath)), "tokenizer.bin")
            guard_file(tok_out, "tokenizer_bin", a.force, inputs, "tokenizer output")
    model = model_from_checkpoint(load_checkpoint(a.checkpoint)).eval()
    if version == -1:
        export_hf(model, a.filepath, a.tokenizer)
        return
    export_bin(model, a.filepath, version, group_size)
    if a.tokenizer:
        export_tokenizer(a.tokenizer, tok_out)


if __name__ == "__main__":
    cli_main(main)
