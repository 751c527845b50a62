"""Memory a command needs, estimated from its settings before anything is built, against what this
machine can give: a setting that cannot fit is refused with one line naming it, instead of an
allocator failure (or the kernel's OOM killer) after the run folder was made.

The estimate is a LOWER BOUND of the peak: it counts only tensors that certainly exist together, so
a configuration that fits is never refused; one that passes may still run out (allocator slack,
attention's and backward's temporaries), which the error boundary reports as one line
(tinylab/core/errors.py). In bytes, with p = parameters (`param_count`, model.num_params() exactly),
N = batch_size x max_seq_len tokens of one micro-batch, P = 4 bytes (8 in float64) for parameters
and the fused head's fp32 sums, A = P for activations (2 under bf16 / fp16 autocast):

  parameters         p x P                     (under FSDP: / processes, as gradients and state)
  gradients          p x P                     (probes / lenses train small heads: not counted)
  optimizer state    AdamW: 2 p x P (two moments); Adafactor: rows + columns of each matrix,
                     whole vectors (x 2 with adafactor_beta1 > 0: the first moment is a full copy)
  activations        N x n_layers x (10 dim + 4 hidden) x A: what each block keeps for backward
                     (RMSNorm inputs and outputs, q, k, v, the rotated q and k, the attention
                     output, the SwiGLU's gate, up, silu and product); with activation
                     checkpointing N x (n_layers x dim + 10 dim + 4 hidden) x A: every block's
                     input, and one block recomputed in backward
  fused head         N x dim x (3 A + P)  (embedding output, final norm, d/dh) + vocab x dim x P
                     (d/dW) + one chunk of logits, rows x vocab x P (tinylab/nn/fused_head.py: _head_chunk_rows)
  RoPE tables        max_seq_len x head_dim x 4 (cos and sin, fp32)
  batch buffers      train.py: 4 int64 arrays of batch_size x (max_seq_len + 1) (the loader's window
                     gather, its index, x, y) and the uint16 windows read from the mmap;
                     finetune_t0.py: every micro-batch of an optimizer step at once (tokens,
                     targets, segment and position ids, loss weights) and the packed rows;
                     train.py with document_mask: + the windows' int64 segment (and position) ids
  packed-rows mask   finetune_t0.py, and train.py with document_mask, with SDPA or dense:
                     batch_size x max_seq_len^2 x (A + 1) (the bool mask and its additive form)
  loss evaluation    eval_batch_size x (max_seq_len + 1) int64 windows (no gradients); with
                     document_mask their ids and bool mask, eval_batch_size x max_seq_len^2
  generation         generation_batch_size x min(max_seq_len, max_new_tokens) x n_layers x 2 x
                     kv_dim x P (the KV cache) and the prompt windows

Training's peak is parameters + gradients + optimizer state + one micro-batch; the evaluations'
are parameters + optimizer state + theirs (eval_only=True: the evaluations' alone, without the
state); the largest is compared with the memory available: on
the CPU MemAvailable of /proc/meminfo (else physical memory), shared by the processes of this
machine (LOCAL_WORLD_SIZE); on CUDA torch.cuda.mem_get_info of the device plus what this process
holds cached. Measured against this bound (tests/test_bad_input_sizes.py, docs/training.md): the
bytes saved for backward per block per token are 10 dim + 4 hidden (+ 10 to 20 fp32 values per
token for the attention's statistics, not counted); in a whole fp32 training step on the CPU each
token costs 1.2x (the base8M shape) to 1.6x (dim 128) the bound in resident memory, 2.4x with
activation checkpointing (backward's temporaries).

The error names the keys behind the largest terms: those far above the base8M configuration's
values (REFERENCE), or every key of the largest term when none is.
"""
import math
import os
from dataclasses import dataclass, field
from decimal import Decimal

from tinylab.core.errors import UserError
from tinylab.nn.attention import ATTENTION, resolve

GiB = 2 ** 30
BLOCK_DIM, BLOCK_HIDDEN = 10, 4  # per token, elements each block keeps for backward: 10 dim + 4 hidden
HEAD_CHUNK_LOGITS, HEAD_MIN_ROWS = 1 << 22, 1024  # nn/fused_head.py _head_chunk_rows: ~4M logits, >= 1024 rows
# the base8M configuration (configs/base8M.py's shape, the schema's defaults): the yardstick for
# which key of a term is outsized
REFERENCE = {"dim": 288, "n_layers": 6, "vocab_size": 8192, "hidden_dim": 768, "batch_size": 128,
             "max_seq_len": 256, "eval_batch_size": 128, "generation_batch_size": 16, "max_new_tokens": 256,
             "num_samples": 1, "gradient_accumulation_steps": 4}


def bytes_text(n) -> str:
    """'63.6 MiB', '23.1 GiB', '3.4 TiB', else '3.4e+25 bytes' (exact for integers of any size)."""
    for unit, size in (("TiB", 2 ** 40), ("GiB", GiB)):
        if size <= n < 1024 * size:
            return f"{n / size:.1f} {unit}"
    if n < GiB:
        return f"{n / 2 ** 20:.1f} MiB"
    return f"{Decimal(int(n)):.1e} bytes"


def value_text(v) -> str:
    """A key's value in a message: an int of more than 20 digits as 1.0e+400."""
    return f"{Decimal(v):.1e}" if isinstance(v, int) and abs(v) >= 10 ** 20 else str(v)


# ---------------------------------------------------------------------- the model's shape

def ffn_hidden_dim(dim: int, multiple_of: int, hidden_dim: int = 0) -> int:
    """ModelArgs.ffn_hidden_dim in integers (no float overflow for any dim): 2/3 of 4 dim rounded up
    to a multiple of multiple_of; the same as the model's rule below 2^50."""
    if hidden_dim:
        return hidden_dim
    hidden = 8 * dim // 3
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


@dataclass(frozen=True)
class Shape:
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    hidden_dim: int  # resolved
    tie_embeddings: bool = True
    max_seq_len: int = 0
    settable: tuple = ()  # the shape keys the user sets (a checkpoint's shape has none)

    @classmethod
    def from_config(cls, cfg):
        return cls(dim=cfg["dim"], n_layers=cfg["n_layers"], n_heads=cfg["n_heads"],
                   n_kv_heads=cfg["n_kv_heads"] or cfg["n_heads"], vocab_size=cfg["vocab_size"],
                   hidden_dim=ffn_hidden_dim(cfg["dim"], cfg["multiple_of"], cfg["hidden_dim"]),
                   tie_embeddings=bool(cfg["tie_embeddings"]), max_seq_len=cfg["max_seq_len"],
                   settable=("dim", "n_layers", "vocab_size") + (("hidden_dim",) if cfg["hidden_dim"] else ()))

    @classmethod
    def from_model_args(cls, args, max_seq_len=None):
        """A checkpoint's model_args (a dict, or ModelArgs); None when they are not positive
        integers (the model's own loading reports that)."""
        from model import ModelArgs
        a = ModelArgs.from_dict(args) if isinstance(args, dict) else args
        ints = (a.dim, a.n_layers, a.n_heads, a.kv_heads(), a.vocab_size, a.multiple_of, a.max_seq_len)
        if not all(type(v) is int and v > 0 for v in ints) or (a.hidden_dim is not None and type(a.hidden_dim) is not int):
            return None
        return cls(dim=a.dim, n_layers=a.n_layers, n_heads=a.n_heads, n_kv_heads=a.kv_heads(), vocab_size=a.vocab_size,
                   hidden_dim=ffn_hidden_dim(a.dim, a.multiple_of, a.hidden_dim or 0),
                   tie_embeddings=bool(a.tie_embeddings), max_seq_len=max_seq_len or a.max_seq_len)

    @property
    def head_dim(self):
        return self.dim // self.n_heads

    @property
    def kv_dim(self):
        return self.n_kv_heads * self.head_dim

    def matrices(self):
        """(rows, columns, how many) of every parameter tensor (vectors as rows x 1)."""
        d, h = self.dim, self.hidden_dim
        per_layer = [(d, d, 2), (self.kv_dim, d, 2), (h, d, 2), (d, h, 1), (d, 1, 2)]  # wq wo, wk wv, w1 w3, w2, norms
        out = [(self.vocab_size, d, 1 if self.tie_embeddings else 2), (d, 1, 1)]
        return out + [(r, c, k * self.n_layers) for r, c, k in per_layer]

    def factors(self, *names):
        """{key: value} of the shape keys a term grows with, for the user-settable ones."""
        values = {"dim": self.dim, "n_layers": self.n_layers, "vocab_size": self.vocab_size, "hidden_dim": self.hidden_dim}
        return {n: values[n] for n in names if n in self.settable}


def param_count(shape: Shape) -> int:
    """Parameters counted once, as model.num_params() (a tied embedding/head matrix is one)."""
    return sum(r * c * k for r, c, k in shape.matrices())


# ---------------------------------------------------------------------- terms and their sum

@dataclass
class Term:
    name: str
    bytes: int
    factors: dict = field(default_factory=dict)  # {key: value} the term grows with
    hint: str = ""


@dataclass
class Estimate:
    what: str  # "training", "the generation evaluation", ...
    terms: list

    @property
    def total(self):
        return sum(t.bytes for t in self.terms)

    def responsible(self):
        """The keys behind the largest terms: those far above REFERENCE (the largest ratio and any
        within 10x of it), else every key of the largest term."""
        big = [t for t in self.terms if t.bytes * 10 >= self.total]
        factors = {}
        for t in sorted(big, key=lambda t: -t.bytes):
            factors.update({k: v for k, v in t.factors.items() if k not in factors})
        if not factors:
            return {}
        ratio = {k: math.log10(max(v, 1)) - math.log10(REFERENCE.get(k.lstrip("-"), 1)) for k, v in factors.items()}
        top = max(ratio.values())
        return {k: v for k, v in factors.items() if ratio[k] >= top - 1}

    def line(self, available_text):
        keys = self.responsible()
        named = ", ".join(f"{k}={value_text(v)}" for k, v in keys.items())
        shown = [t for t in sorted(self.terms, key=lambda t: -t.bytes) if t.bytes * 100 >= self.total][:4]
        parts = ", ".join(f"{t.name} {bytes_text(t.bytes)}" for t in shown)
        hint = ""
        if keys:
            names = list(keys)
            hint = "; lower " + (f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0])
            if "batch_size" in keys and self.what == "training":
                hint += " (gradient_accumulation_steps keeps the global batch)"
        extra = next((t.hint for t in shown if t.hint), "")
        hint += f", or {extra}" if hint and extra else (f"; {extra}" if extra else "")
        return (f"{named + ': ' if named else ''}{self.what} needs at least {bytes_text(self.total)} ({parts}), "
                f"{available_text}{hint}")


# ---------------------------------------------------------------------- what this machine has

def _meminfo_available():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def available_memory(device: str):
    """(bytes this process may still allocate on `device`, how to say it) or (None, "") when it
    cannot be told. CUDA: the device's free memory plus what this process holds cached; otherwise
    the machine's available memory (MPS shares it)."""
    if str(device).startswith("cuda"):
        import torch
        dev = torch.device(device)
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        free, _ = torch.cuda.mem_get_info(index)
        free += torch.cuda.memory_reserved(index) - torch.cuda.memory_allocated(index)
        return free, f"cuda:{index} has {bytes_text(free)} free"
    avail = _meminfo_available()
    return avail, (f"this machine has {bytes_text(avail)} available" if avail is not None else "")


def check(estimate: Estimate, device: str, processes: int = 1):
    """Refuse (UserError) when the estimate exceeds what `device` has; `processes` on this machine
    share its memory (the CPU only: each CUDA process has its own device)."""
    avail, text = available_memory(device)
    if avail is None:
        return
    if not str(device).startswith("cuda") and processes > 1:
        text += f" for {processes} processes"
        avail //= processes
    if estimate.total > avail:
        raise UserError(estimate.line(text))


# ---------------------------------------------------------------------- training (train.py, finetune_t0.py)

def _bytes(dtype: str):
    """(parameter bytes, activation bytes): float64 8/8, float32 4/4, bf16 / fp16 autocast 4/2."""
    if dtype == "float64":
        return 8, 8
    return 4, (2 if dtype in ("bfloat16", "float16") else 4)


@dataclass(frozen=True)
class TrainingLoad:
    """What a training run holds besides its model: the keys of train.py / finetune_t0.py the
    estimate reads (a key a program does not have counts as off)."""
    batch_size: int
    max_seq_len: int
    accum: int  # gradient_accumulation_steps, over all processes
    optimizer: str
    first_moment: bool  # Adafactor with adafactor_beta1 > 0
    frozen: bool  # probes / lenses: heads trained on a frozen model (no gradients or state of it)
    eval_only: bool  # one evaluation, no step: no gradients, no optimizer state
    activation_checkpointing: bool
    eval_rows: int  # eval_batch_size (0 = batch_size)
    generation_rows: int  # generation_batch_size when the run generates, else 0
    new_tokens: int  # max_new_tokens
    attention_impl: str  # the packed rows' attention backend (or auto): whether they get a dense mask
    document_arrays: int = 0  # train.py's document_mask: int64 id arrays per window (segments, positions)

    @classmethod
    def from_config(cls, cfg) -> "TrainingLoad":
        frozen = bool(cfg.get("probes") or cfg.get("lenses"))
        generates = not frozen and cfg.get("max_new_tokens", 0) > 0 and cfg.get("generation_eval_iters", 0) > 0
        original_sizes = cfg.get("eval_batch_sizes") == "batch_size"  # the study's: evaluations read batch_size
        return cls(batch_size=cfg["batch_size"], max_seq_len=cfg["max_seq_len"],
                   accum=cfg["gradient_accumulation_steps"], optimizer=cfg["optimizer"],
                   first_moment=bool(cfg.get("adafactor_beta1")), frozen=frozen, eval_only=bool(cfg.get("eval_only")),
                   activation_checkpointing=bool(cfg.get("activation_checkpointing")),
                   eval_rows=cfg["batch_size"] if original_sizes else cfg.get("eval_batch_size") or 0,
                   generation_rows=(cfg["batch_size"] if original_sizes else cfg["generation_batch_size"]) if generates
                   else 0,
                   new_tokens=cfg.get("max_new_tokens", 0), attention_impl=cfg.get("attention_impl", "auto"),
                   document_arrays=(1 + bool(cfg.get("document_positions"))) if cfg.get("document_mask") else 0)


def optimizer_state(shape: Shape, load: TrainingLoad, pb, shard=1) -> Term:
    keys = shape.factors("dim", "n_layers", "vocab_size", "hidden_dim")
    if load.optimizer == "adafactor":
        n = sum((r + c if c > 1 else r) * k for r, c, k in shape.matrices())  # factored second moments
        if load.first_moment:
            n += param_count(shape)  # the first moment: a full copy
        return Term("Adafactor state", -(-n * pb // shard), keys)
    return Term("AdamW state", -(-2 * param_count(shape) * pb // shard), keys)


def training_estimate(cfg, shape: Shape, dtype="float32", world_size=1, fsdp=False, packed=False, packed_mask=False):
    """The larger of training's and the evaluations' peaks, per process, for cfg's batch_size and
    max_seq_len. `packed`: finetune_t0.py's batches (every micro-batch of a step at once);
    `packed_mask`: its dense attention mask (SDPA's, dense's; train.py's with document_mask)."""
    load = TrainingLoad.from_config(cfg)
    pb, ab = _bytes(dtype)
    shard = world_size if fsdp else 1  # FSDP: parameters, gradients and state sharded over the processes
    static = [Term("parameters", -(-param_count(shape) * pb // shard), shape.factors("dim", "n_layers", "vocab_size",
                                                                                     "hidden_dim")),
              Term("RoPE tables", load.max_seq_len * shape.head_dim * 4, {"max_seq_len": load.max_seq_len})]
    if not load.frozen and not load.eval_only:
        static.append(optimizer_state(shape, load, pb, shard))
    estimates = [] if load.eval_only else [Estimate("training", static + _training_terms(
        load, shape, pb, ab, shard, world_size, packed, packed_mask))]
    B, L = load.batch_size, load.max_seq_len
    eval_rows = load.eval_rows or B
    if eval_rows != B or load.eval_only:
        rows = {"eval_batch_size": eval_rows, "max_seq_len": L}
        terms = [Term("evaluation batch buffers", eval_rows * (L + 1) * (4 * 8 + 2) + eval_rows * L * 8 * load.document_arrays,
                      rows)]
        if packed_mask and load.document_arrays:  # no gradients: the bool mask alone
            terms.append(Term("document attention mask", eval_rows * L * L, rows))
        estimates.append(Estimate("the loss evaluation", static + terms))
    if load.generation_rows:
        g = load.generation_rows
        rows = {"generation_batch_size": g, "max_seq_len": L}
        estimates.append(Estimate("the generation evaluation", static + [
            kv_cache(shape, g, min(L, load.new_tokens), pb, {**rows, **shape.factors("n_layers", "dim")}),
            Term("prompt windows", g * (L + 1) * (4 * 8 + 2), rows)]))
    return max(estimates, key=lambda e: e.total)


def _training_terms(load: TrainingLoad, shape: Shape, pb, ab, shard, world_size, packed, packed_mask):
    """One training step's terms beside the parameters and optimizer state: the batch buffers
    and, unless the model is frozen, gradients, activations, the fused head (and the packed
    rows' mask)."""
    B, L, layers, dim, hidden = load.batch_size, load.max_seq_len, shape.n_layers, shape.dim, shape.hidden_dim
    N, V = B * L, shape.vocab_size
    seq = {"batch_size": B, "max_seq_len": L}
    if packed:
        steps = max(1, load.accum // world_size)
        rows = steps * world_size * B * (L + 1) * 16  # the packed rows' token and segment ids, int64
        terms = [Term("batch buffers", rows + steps * N * (4 * 8 + pb), {**seq, "gradient_accumulation_steps": load.accum})]
    else:
        terms = [Term("batch buffers", B * (L + 1) * (4 * 8 + 2) + B * L * 8 * load.document_arrays, seq)]
    if load.frozen:
        return terms
    kept = layers * (BLOCK_DIM * dim + BLOCK_HIDDEN * hidden)
    if load.activation_checkpointing:
        kept = layers * dim + BLOCK_DIM * dim + BLOCK_HIDDEN * hidden
    recompute = "" if load.activation_checkpointing else "set activation_checkpointing=True"
    chunk = min(N, max(HEAD_MIN_ROWS, HEAD_CHUNK_LOGITS // V)) * V
    terms += [Term("gradients", -(-param_count(shape) * pb // shard), shape.factors("dim", "n_layers", "vocab_size",
                                                                                   "hidden_dim")),
              Term("activations of one micro-batch", N * kept * ab,
                   {**seq, **shape.factors("n_layers", "dim", "hidden_dim")}, recompute),
              Term("the fused head", N * dim * (3 * ab + pb) + (V * dim + chunk) * pb,
                   {**seq, **shape.factors("dim", "vocab_size")})]
    if packed_mask:
        what = "document attention mask" if load.document_arrays else "packed rows' attention mask"
        terms.append(Term(what, B * L * L * (ab + 1), seq))
    return terms


def kv_cache(shape: Shape, rows, capacity, pb, factors):
    return Term("KV cache", 2 * shape.n_layers * rows * capacity * shape.kv_dim * pb, factors)


def check_training(cfg, run, shape: Shape, packed=False):
    """train.py / finetune_t0.py: refuse a configuration that cannot fit on run.device (see the
    module docstring). `shape`: Shape.from_config, or a checkpoint's (resume, the T0 base)."""
    if shape is None:
        return
    # the backend packed rows (and document-masked windows) attend with: whether it builds the
    # dense (B, 1, T, T) mask
    load = TrainingLoad.from_config(cfg)
    impl = resolve(load.attention_impl, run.device_type, cfg.get("dropout", 0.0))
    packed_mask = (packed or load.document_arrays > 0) and ATTENTION.get(impl).dense_packed_mask
    est = training_estimate(cfg, shape, run.dtype, run.dist.world_size, run.fsdp, packed, packed_mask)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1) if run.dist.enabled else 1
    check(est, run.device, processes=local)


# ---------------------------------------------------------------------- the tools

def generation_estimate(shape: Shape, rows, prompt_len, new_tokens, pb, keys, prompts=0, windows=0):
    """model.generate of `rows` prompts of `prompt_len` tokens for `new_tokens` more (sample.py,
    eval_features.py). `keys` names the settings: {"rows", "new"[, "prompts"]: flag}; `prompts`:
    how many prompts are held (eval_features.py's --num_samples); `windows`: how many BOS-aligned
    windows of max_seq_len + 1 tokens the prompts are cut from at once (lm_eval.LMEvaluator.generate,
    its generation_batch_size)."""
    L = shape.max_seq_len
    capacity = min(L, min(prompt_len, L) + new_tokens - 1)
    row_key, new_key = {keys["rows"]: rows}, {keys["new"]: new_tokens}
    # generate's schedule: the output (rows, prompt + new) and three (new - 1, rows) int64 tables
    schedule = 8 * rows * (prompt_len + new_tokens) + 3 * 8 * rows * max(new_tokens - 1, 0)
    terms = [kv_cache(shape, rows, capacity, pb, row_key),
             Term("the sampling schedule", schedule, {**row_key, **new_key}),
             Term("prompts and logits", rows * (prompt_len * 16 + shape.vocab_size * 4), row_key)]
    if windows:
        terms.append(Term("prompt windows", windows * (L + 1) * (4 * 8 + 2), {keys["rows"]: windows}))
    if prompts:  # a list entry (8 bytes) for each prompt's tokens and for its target's
        terms.append(Term("the prompts", prompts * 16, {keys["prompts"]: prompts}))
    return Estimate("generation", terms)


def forward_estimate(shape, rows, seq_len, pb, flag, outputs="logits", vocab_size=None):
    """An evaluation tool's batch: one forward pass (no gradients) of `rows` sequences of `seq_len`
    tokens. outputs="logits": the (rows, seq_len, vocab) scores, in the model's dtype and as the
    float64 copy and log-softmax the tools score in; "states": every block's output kept. `shape`
    None (a Hugging Face model): its logits alone, of `vocab_size`."""
    tokens, key = rows * seq_len, {flag: rows}
    terms = []
    if shape is not None:
        vocab_size = shape.vocab_size
        terms.append(Term("hidden states", tokens * (shape.dim + shape.hidden_dim) * pb, key))
        if outputs != "logits":
            terms.append(Term("every block's output", tokens * shape.dim * shape.n_layers * pb, key))
    if outputs == "logits":
        terms.append(Term("logits", tokens * vocab_size * (pb + 16), key))
    return Estimate("one batch", terms)


def model_shape(model):
    """The Shape of one of our models (its own max_seq_len); None for another kind (HFCausalLM)."""
    from model import ModelArgs
    return Shape.from_model_args(model.params) if isinstance(model.params, ModelArgs) else None


def param_bytes(model):
    return next(model.parameters()).element_size()


def check_model_batch(model, rows, seq_len, flag, outputs="logits"):
    """Evaluation tools: refuse a batch of `rows` x `seq_len` that cannot fit beside `model`."""
    if rows > 0 and seq_len > 0:
        est = forward_estimate(model_shape(model), rows, seq_len, param_bytes(model), flag, outputs,
                               getattr(model.params, "vocab_size", 0))
        check(est, str(next(model.parameters()).device))


def check_generation(model, rows, prompt_len, new_tokens, keys, prompts=0, windows=0):
    """sample.py / eval_features.py: refuse a generation that cannot fit beside `model`."""
    shape = model_shape(model)
    if shape is not None:
        check(generation_estimate(shape, rows, prompt_len, new_tokens, param_bytes(model), keys, prompts, windows),
              str(next(model.parameters()).device))


def growth_estimate(grown: Shape, with_optimizer: bool) -> Estimate:
    """grow.py: the grown weights and (when the checkpoint has them) their AdamW moments, made
    beside the loaded checkpoint, and the grown model built to measure the loss (fp32)."""
    p = param_count(grown) * 4
    terms = [Term("grown parameters", p, {}, "grow on a machine with more memory"), Term("the grown model", p)]
    if with_optimizer:
        terms.append(Term("grown AdamW state", 2 * p))
    return Estimate(f"growing to dim {grown.dim}, {grown.n_layers} layers", terms)
