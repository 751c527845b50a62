"""Move models between tinystories-lab and other tools.

    python export.py out/model.bin --version=0 --checkpoint=out/ckpt.pt   # llama2.c run.c (legacy)
    python export.py out/model.bin --version=1 --checkpoint=out/ckpt.pt   # llama2.c fp32 + header
    python export.py out/model.bin --version=2 --checkpoint=out/ckpt.pt   # llama2.c runq.c, int8 Q8_0
    python export.py out/hf --version=-1 --checkpoint=out/ckpt.pt [--tokenizer=tok.model]  # HF Llama dir
    python export.py --tokenizer=data/tok8192.model [out/tok8192.bin]     # run.c tokenizer .bin
    python export.py out/imported --import_hf=path/to/hf_llama_dir        # HF Llama -> ckpt.pt
    python export.py out/imported --import_bin=model.bin                  # llama2.c .bin -> ckpt.pt

Formats follow ../shared/spec/interop.md (sections 1-3). Two layouts of the same network meet here:
llama2.c/Meta rotate adjacent pairs (2i, 2i+1) of each head, HF rotates (i, i + head_dim/2); the
rows of wq and wk are permuted per head on the way to HF and back on the way in (k with n_kv_heads),
which keeps every q.k dot product, and therefore the logits, unchanged.

An import output ending in .pt is the checkpoint file; anything else is a folder that gets ckpt.pt,
which is what `train.py --init_from=resume_model --model_dir=DIR` reads.
Every output is written under a temporary name and renamed, so a failure leaves nothing half-written.
"""
import os

from tinylab.checkpoint import load_checkpoint, model_from_checkpoint, save_checkpoint
from tinylab.config import ArgParser
from tinylab.errors import UserError, cli_main
from tinylab.interop import (
    export_bin,
    export_hf,
    export_tokenizer,
    import_output_path,
    imported_checkpoint,
    read_bin,
    read_hf,
)


def main(argv=None):
    ap = ArgParser(description="Export a checkpoint to llama2.c .bin (v0/v1/v2) or a Hugging Face Llama folder, "
                               "write a run.c tokenizer .bin, or import an HF / llama2.c model as a checkpoint.")
    ap.add_argument("filepath", nargs="?", help="output: .bin file, HF folder, tokenizer .bin, or imported checkpoint "
                                                "(.pt file, or a folder that gets ckpt.pt)")
    ap.add_argument("--version", type=int, default=None, help="format of a --checkpoint export: 0 (default), 1, 2 = llama2.c "
                                                              ".bin (2 = int8 Q8_0); -1 = HF Llama folder. Refused in other modes")
    ap.add_argument("--checkpoint", help="our checkpoint (ckpt.pt or its folder) to export")
    ap.add_argument("--tokenizer", help="sentencepiece .model: alone, write run.c's tokenizer .bin; with --version=-1, "
                                        "add it to the HF folder; with a .bin export, write tokenizer.bin beside it")
    ap.add_argument("--group_size", type=int, default=None, help="Q8_0 group size for --version=2 (default 64, halved "
                                                                 "until it divides dim); refused with other versions")
    ap.add_argument("--import_hf", metavar="DIR", help="HF LlamaForCausalLM folder to import as our checkpoint")
    ap.add_argument("--import_bin", metavar="FILE", help="llama2.c model .bin (v0/v1/v2) to import as our checkpoint")
    a = ap.parse_args(argv)

    # --version is checked first, in every mode: a typo or a flag that does nothing must not pass silently
    if a.version is not None and a.version not in (-1, 0, 1, 2):
        raise UserError(f"unknown version {a.version}: 0, 1, 2 write llama2.c .bin files, -1 a Hugging Face folder")
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
        args, state = read_hf(a.import_hf) if a.import_hf else read_bin(a.import_bin)
        source = f"hf:{a.import_hf}" if a.import_hf else f"llama2.c:{a.import_bin}"
        out = import_output_path(a.filepath)
        save_checkpoint(imported_checkpoint(args, state, source), out)
        print(f"wrote {out} (imported from {source}; dim={args.dim}, n_layers={args.n_layers}, n_heads={args.n_heads}, "
              f"n_kv_heads={args.kv_heads()}, vocab_size={args.vocab_size}, tied={args.tie_embeddings})")
        return

    if a.checkpoint is None:
        if a.tokenizer is None:
            raise UserError("nothing to do: give --checkpoint, --tokenizer, --import_hf or --import_bin")
        export_tokenizer(a.tokenizer, a.filepath or os.path.splitext(a.tokenizer)[0] + ".bin")
        return
    if not a.filepath:
        raise UserError("missing the output path (first argument)")
    if group_size <= 0:
        raise UserError(f"--group_size must be positive, not {group_size}")
    model = model_from_checkpoint(load_checkpoint(a.checkpoint)).eval()
    if version == -1:
        export_hf(model, a.filepath, a.tokenizer)
        return
    export_bin(model, a.filepath, version, group_size)
    if a.tokenizer:
        export_tokenizer(a.tokenizer, os.path.join(os.path.dirname(os.path.abspath(a.filepath)), "tokenizer.bin"))


if __name__ == "__main__":
    cli_main(main)
