"""finetune_t0.py's own config keys, declared next to the code that reads them (tinylab/schema.py
assembles the program from these lists), their rules between keys, and the typed options the
T0 components take:

    T0_DATA, T0_MEGATRON, T0_LOSS, T0_START     the keys, by --help section
    check_megatron, check_reset_progress, check_start    rules (schema.py's FINETUNE_T0 runs them)
    TokenizationOptions, PackingOptions, LossOptions     from_config(cfg): typed values of the keys
"""
from dataclasses import asdict, dataclass, fields

from tinylab.core.compat import declare_difference
from tinylab.core.config import Key
from tinylab.core.errors import UserError
from tinylab.t0.batches import NORMALIZATIONS
from tinylab.t0.encode import TRUNCATE_SIDES, TRUNCATIONS, ExampleEncoder
from tinylab.t0.megatron import TRAIN_GROUPS, check_weighted_splits
from tinylab.t0.megatron_args import MEGATRON_ARGS
from tinylab.t0.overlap import OVERLAP_CHECK
from tinylab.t0.packing import MAX_PACK_BUFFER, MIXINGS, PACKINGS, TOO_LONG, PackedStream
from tinylab.t0.sources.megatron import RANGE_READING
from tinylab.t0.valid_blend import VALID_GROUPS

COUNT, NONNEG = "[1, inf)", "[0, inf)"

# ---------------------------------------------------------------------- keys

MIXING = Key("mixing", "example", "example: mix examples by weight, then pack | row: Megatron's blend of packed rows",
             choices=MIXINGS)
PACKING = Key("packing", "best_fit", "best_fit: best-fit decreasing over pack_buffer drawn examples, rows in an order "
              "that keeps the mixture's proportions (>= 0.99 full on long-tailed lengths) | next_fit: greedy, examples in "
              "draw order, a row closed when the next does not fit (Megatron's; ~0.85-0.88 full)", choices=PACKINGS)
# Megatron packs each source on its own, greedily, and blends the sources' rows by weight
declare_difference(MIXING, original="row", family="t0",
                   behaviour="each source packed on its own; row i from the source maximising w * max(i, 1) - rows "
                             "taken (BlendableDataset), every row single-source",
                   source="bigscience-workshop/Megatron-DeepSpeed megatron/data/blendable_dataset.py:30")
declare_difference(PACKING, original="next_fit", family="t0",
                   behaviour="greedy next-fit in the shuffled order, no look-ahead; rows of seq_length + 1 tokens, "
                             "right-padded",
                   source="bigscience-workshop/Megatron-DeepSpeed megatron/data/decoder_packed_mtf_dataset.py:464")
TOO_LONG_EXAMPLES = Key("too_long_examples", "drop", "an example longer than a row (after max_input_len / "
                        "max_target_len): drop = left out before packing | close_row = Megatron's: it stays in the "
                        "shuffled order and, met by next-fit packing, closes the open row and is skipped "
                        "(packing=next_fit only)", choices=TOO_LONG)
declare_difference(TOO_LONG_EXAMPLES, original="close_row", family="t0",
                   behaviour="an example longer than the row stays in the permutation; when met it closes the open "
                             "row (even one with room left) and is skipped",
                   source="bigscience-workshop/Megatron-DeepSpeed megatron/data/decoder_packed_mtf_dataset.py:488")

T0_DATA = [
    Key("mixture", "", "mixture.json: {\"train\": [sources], \"valid\": [sources or groups], \"test\": [...]} "
        "(docs/t0.md)", input=True),
    Key("make_demo_data", "", "write the built-in multitask set to this folder and exit (an existing one is moved "
        "aside only with --overwrite=True)", output="demo_data"),
    MIXING,
    Key("tokenizer_model", "", "'' = the tokenizer named by the base checkpoint's config", input=True),
    Key("add_bos", True, "BOS before every input (our models were pretrained with one per document)"),
    Key("target_space", True, "exactly one space between input and target (False: the target text as is)"),
    Key("add_eos", True, "EOS after every target (what makes generation stop)"),
    Key("max_input_len", 1024, "input limit in tokens (BOS included; T0's)", range=COUNT),
    Key("max_target_len", 256, "target limit in tokens (EOS included; T0's)", range=COUNT),
    Key("truncation", "truncate", "what to do with examples over those limits", choices=TRUNCATIONS),
    Key("truncate_side", "left", "which part of a too-long input is kept: left = BOS + its last tokens (the question) "
        "| right = its first max_input_len tokens (Mesh-TF / seqio, as T0 was trained)", choices=TRUNCATE_SIDES),
    PACKING, TOO_LONG_EXAMPLES,
    Key("pack_buffer", 2000, "packing=best_fit: examples packed together (more = fuller rows, more work per chunk)",
        range=f"[1, {MAX_PACK_BUFFER}]"),
    Key("pad_id", 0, "id written into padding (masked everywhere, so any id works)", range=NONNEG),
    Key("batch_size", 16, "packed rows per micro-batch", range=COUNT),
    Key("max_seq_len", 0, "row length L (rows hold L + 1 tokens); 0 = the base model's", range=NONNEG),
    Key("pretrain_text", "", "a pretokenized dataset folder whose test shard's LM loss is logged as "
        "loss/valid/pretrain_text (forgetting; not in loss/valid)", input=True),
]
LOSS_NORMALIZATION = Key("loss_normalization", "token", "token | example (BLOOMZ --norm-target-loss) | "
                         "token_microbatch (Megatron)", choices=NORMALIZATIONS)
declare_difference(LOSS_NORMALIZATION, original="token_microbatch", family="t0",
                   behaviour="each micro-batch's loss is the token mean of its own target labels; the step averages "
                             "the micro-batches' gradients",
                   source="bigscience-workshop/Megatron-DeepSpeed megatron/model/gpt_model.py:196")
T0_LOSS = [
    Key("prefixlm", False, "input tokens of an example attend to each other both ways (Megatron: bare --prefixlm)",
        nargs=0),
    LOSS_NORMALIZATION,
    Key("rank_eval_examples", 200, "rank-classification examples per validation group with answer_choices; "
        "0 disables", range=NONNEG),
    Key("rank_eval_batch_size", 0, "0 = batch_size", range=NONNEG),
    Key("score_eos", False, "also score each choice's EOS"),
]


def _megatron_split_keys():
    """Megatron's data arguments in its spelling (docs/t0.md, "Megatron-DeepSpeed's data and arguments")."""
    keys = []
    for split, what in (("train", "the training blend"), ("valid", "validation groups, each evaluated on its own"),
                        ("test", "test groups, evaluated once at the end (loss/test/<name>)")):
        keys.append(Key(f"{split}_weighted_split_paths", [], f"{what}: --{split}-weighted-split-paths "
                        f"\"NAME: W1 START:END PREFIX1, W2 START:END PREFIX2\" [\"NAME2: ...\" ...]", type=list, sep=None,
                        nargs="+", aliases=(f"{split}-weighted-split-paths",)))
        keys.append(Key(f"{split}_weighted_split_paths_path", "", f"a file holding the {split} groups as one line of "
                        f"quoted groups (Megatron's --{split}-weighted-split-paths-path)", nargs=1,
                        aliases=(f"{split}-weighted-split-paths-path",)))
    return keys


T0_MEGATRON = _megatron_split_keys() + [
    Key("preprocess", False, "write --input's inputs/targets as a Megatron indexed prefix --output_prefix and exit "
        "(tools/preprocess_data.py's files, with this run's tokenizer and tokenisation keys)", nargs=0),
    Key("input", "", "--preprocess: the json / jsonl / parquet file of inputs and targets", nargs=1, input=True),
    Key("output_prefix", "", "--preprocess: writes <prefix>_inputs_document.{bin,idx} and "
        "<prefix>_targets_document.{bin,idx} (those of --json-keys; existing ones only with --overwrite=True)",
        nargs=1, aliases=("output-prefix",), output="megatron_prefix", output_path=False),  # guarded by preprocess()
    TRAIN_GROUPS, RANGE_READING, OVERLAP_CHECK, VALID_GROUPS,
]
# Megatron's finetune_t0.py arguments in its spelling (tinylab/t0/megatron_args.py)
T0_MEGATRON_ARGS = MEGATRON_ARGS

T0_START = [
    Key("reset_progress", False, "init_from=resume_model: also take model_dir's optimizer state (moments, Adafactor's "
        "step counts); the iteration count, LR schedule, data stream and best loss start at 0 (Megatron's "
        "--reset-progress without --no-load-optim)", nargs=0, aliases=("reset-progress",)),
]

# finetuning settings that go with an optimizer preset (docs/t0.md), unless set by the user
PRESET_EXTRAS = {"bloomz_adam": {"loss_normalization": "example", "prefixlm": False}}


# ---------------------------------------------------------------------- rules between keys

def check_megatron(cfg):
    check_weighted_splits(cfg)
    if cfg["too_long_examples"] == "close_row" and cfg["packing"] != "next_fit":
        raise UserError(f"too_long_examples=close_row is next-fit packing's (Megatron's), not packing={cfg['packing']}'s: "
                        f"set packing=next_fit, or too_long_examples=drop")


def check_reset_progress(cfg):
    if cfg["reset_progress"] and cfg["init_from"] != "resume_model":
        raise UserError(f"reset_progress=True restarts a run from model_dir's weights and optimizer state: it needs "
                        f"init_from=resume_model, not {cfg['init_from']} (resume_train continues out_dir's progress)")


def check_start(cfg):
    """finetune_t0.py continues a trained model (the T0 part of schema.py's check_t0)."""
    if cfg["init_from"] not in ("resume_model", "resume_train"):
        raise UserError(f"init_from must be resume_model (finetune --model_dir) or resume_train (continue --out_dir), "
                        f"not '{cfg['init_from']}'")


def loads_model(cfg):
    """Whether the command loads a base model (--make_demo_data and --preprocess do not need one)."""
    return not cfg["make_demo_data"] and not cfg["preprocess"]


# ---------------------------------------------------------------------- typed options

@dataclass(frozen=True)
class TokenizationOptions:
    """How records become token ids (tinylab/t0/encode.py): the ExampleEncoder's settings."""
    add_bos: bool = True
    target_space: bool = True
    add_eos: bool = True
    max_input_len: int = 1024
    max_target_len: int = 256
    truncation: str = "truncate"
    truncate_side: str = "left"

    @classmethod
    def from_config(cls, cfg) -> "TokenizationOptions":
        return cls(**{f.name: cfg[f.name] for f in fields(cls)})

    def encoder(self, tokenizer) -> ExampleEncoder:
        return ExampleEncoder(tokenizer, **asdict(self))

    def identity(self) -> dict:
        """The settings a training stream depends on; truncate_side came later and counts only off
        its earlier behaviour (left), so older runs still resume."""
        out = asdict(self)
        if self.truncate_side == "left":
            del out["truncate_side"]
        return out


@dataclass(frozen=True)
class PackingOptions:
    """How the training examples become rows (tinylab/t0/packing.py)."""
    max_seq_len: int  # rows hold max_seq_len + 1 tokens
    seed: int
    mixing: str = "example"
    packing: str = "best_fit"
    pack_buffer: int = 2000
    pad_id: int = 0
    too_long_examples: str = "drop"

    @classmethod
    def from_config(cls, cfg) -> "PackingOptions":
        return cls(**{f.name: cfg[f.name] for f in fields(cls)})

    @property
    def row_len(self) -> int:
        return self.max_seq_len + 1

    def stream(self, lengths, weights) -> PackedStream:
        """A seeded PackedStream over sources with these example lengths and weights."""
        return PackedStream(lengths, weights, self.row_len, self.seed, self.mixing, self.packing, self.pack_buffer,
                            self.too_long_examples)

    def identity(self) -> dict:
        """The settings a training stream depends on; packing and pack_buffer came later and count
        only off their earlier behaviour (next_fit), so older runs still resume; too_long_examples
        likewise off drop."""
        out = asdict(self)
        if self.packing == "next_fit":
            del out["packing"], out["pack_buffer"]
        if self.too_long_examples == "drop":
            del out["too_long_examples"]
        return out


@dataclass(frozen=True)
class LossOptions:
    """How packed rows attend and what the loss averages over (tinylab/t0/batches.py)."""
    prefixlm: bool = False
    normalization: str = "token"

    @classmethod
    def from_config(cls, cfg) -> "LossOptions":
        return cls(prefixlm=cfg["prefixlm"], normalization=cfg["loss_normalization"])
