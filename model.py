"""The one model of tinystories-lab: the Llama-2 architecture as in karpathy/llama2.c.

Token embedding (tied with the output head by default), pre-norm RMSNorm blocks, rotary position
embeddings in llama2.c's interleaved-pair layout, grouped-query attention, and a SwiGLU
feed-forward with llama2.c's hidden-size rule. Parameter names are llama2.c's, so its `ckpt.pt`
files load unchanged. Its building blocks live in tinylab/nn/ (projections, fused head, attention
backends, generation's sampling and KV cache).

Additions over llama2.c, each needed by a driver:
  - `attn_mask` / `position_ids` in forward: left-padded generation prompts, any explicit mask;
  - `segment_ids` / `prefix_mask` in forward: packed sequences and prefix-LM (finetune_t0.py),
    the mask built inside by the attention backend (`attention_impl`: tinylab/nn/attention/);
  - `loss_weights` in forward: per-token loss weights (target-only T0 losses);
  - `return_logits=False`: the training loss through the fused head (tinylab/nn/fused_head.py);
  - `generate` with a KV cache (generation evaluations sample hundreds of tokens): every step,
    the prompts' and each new token's, is this module's own forward over the cache;
  - `hidden_states` (per-layer linear probes), `num_params`, `flops_per_token`, `estimate_mfu`;
  - an optional untied output head (`tie_embeddings=False`; HF import/export and growth).
"""
import math
from dataclasses import dataclass, fields
from typing import List, Optional

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from tinylab.nn.attention import ATTENTION, Attend, additive_mask, resolve
from tinylab.nn.fused_head import linear_cross_entropy
from tinylab.nn.linear import Linear
from tinylab.nn.precision import compute_dtype
from tinylab.nn.sampling import KVCache, Windows, next_tokens, skip_draws


@dataclass
class ModelArgs:
    # defaults are llama2.c's (Llama 2 7B); configs always set the small shapes explicitly
    dim: int = 4096
    n_layers: int = 32
    n_heads: int = 32
    n_kv_heads: Optional[int] = None
    vocab_size: int = 32000
    hidden_dim: Optional[int] = None
    multiple_of: int = 256  # SwiGLU hidden layer size is a multiple of this
    norm_eps: float = 1e-5
    max_seq_len: int = 2048
    dropout: float = 0.0
    tie_embeddings: bool = True
    rope_theta: float = 10000.0

    @classmethod
    def from_dict(cls, d):
        """Build from a checkpoint's `model_args`, ignoring keys this version does not know."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def ffn_hidden_dim(self):
        """llama2.c's rule: 2/3 of 4*dim, rounded up to a multiple of `multiple_of`."""
        if self.hidden_dim is not None:
            return self.hidden_dim
        hidden = int(2 * (4 * self.dim) / 3)
        return self.multiple_of * ((hidden + self.multiple_of - 1) // self.multiple_of)

    def kv_heads(self):
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.to(compute_dtype(x))
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return out.type_as(x) * self.weight


def precompute_freqs_cis(head_dim: int, end: int, theta: float = 10000.0):
    """cos/sin tables (end, head_dim/2) for RoPE; computed in fp64, stored in fp32."""
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64)[: head_dim // 2] / head_dim))
    angles = torch.outer(torch.arange(end, dtype=torch.float64), freqs)
    return torch.cos(angles).float(), torch.sin(angles).float()


def apply_rotary_emb(xq, xk, cos, sin):
    """Rotate interleaved pairs (x[2i], x[2i+1]) by position-dependent angles (llama2.c layout).

    xq, xk: (B, T, heads, head_dim), any strides (a few-row projection's output is a transposed
    view: tinylab/nn/linear.py); cos, sin: broadcastable to (B, T, 1, head_dim/2). Each pair is
    x[2i] + i*x[2i+1] times cos + i*sin: one elementwise kernel (3x faster than real arithmetic).
    """
    dt = compute_dtype(xq)
    rotation = torch.complex(cos.to(dt), sin.to(dt))

    def rotate(x):
        pairs = torch.view_as_complex(x.to(dt).contiguous().view(x.shape[:-1] + (-1, 2)))
        return torch.view_as_real(pairs * rotation).flatten(-2).type_as(x)
    return rotate(xq), rotate(xk)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.n_heads = args.n_heads
        self.n_kv_heads = args.kv_heads()
        assert args.dim % args.n_heads == 0, "dim must be divisible by n_heads"
        assert args.n_heads % self.n_kv_heads == 0, "n_heads must be a multiple of n_kv_heads"
        self.head_dim = args.dim // args.n_heads
        self.n_rep = self.n_heads // self.n_kv_heads
        self.wq = Linear(args.dim, args.n_heads * self.head_dim, bias=False)
        self.wk = Linear(args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wv = Linear(args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wo = Linear(args.n_heads * self.head_dim, args.dim, bias=False)
        self.resid_dropout = nn.Dropout(args.dropout)
        self.dropout = args.dropout

    def forward(self, x, cos, sin, attend: Optional[Attend] = None, kv_cache: Optional[KVCache] = None):
        """attend: the forward pass's backend and mask (Transformer._attend); None: SDPA, causal."""
        bsz, seqlen, _ = x.shape
        xq = self.wq(x).view(bsz, seqlen, self.n_heads, self.head_dim)
        xk = self.wk(x).view(bsz, seqlen, self.n_kv_heads, self.head_dim)
        xv = self.wv(x).view(bsz, seqlen, self.n_kv_heads, self.head_dim)
        xq, xk = apply_rotary_emb(xq, xk, cos, sin)
        # (B, heads, T, head_dim)
        xq, xk, xv = xq.transpose(1, 2), xk.transpose(1, 2), xv.transpose(1, 2)
        if kv_cache is not None:
            xk, xv = kv_cache.update(self.layer_id, xk, xv)
        backend, mask = attend if attend is not None else (ATTENTION.get("sdpa")(), None)
        if mask is None and seqlen > 1 and xk.shape[2] != seqlen:
            raise ValueError("several new tokens over a non-empty KV cache need an explicit attn_mask")
        # no mask: causal; a single new query over the cache may see every cached key
        out = backend.attend(xq, xk, xv, mask, causal=mask is None and seqlen > 1,
                             dropout_p=self.dropout if self.training else 0.0)
        out = out.transpose(1, 2).contiguous().view(bsz, seqlen, -1)
        return self.resid_dropout(self.wo(out))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden_dim: int, dropout: float):
        super().__init__()
        self.w1 = Linear(dim, hidden_dim, bias=False)  # gate
        self.w2 = Linear(hidden_dim, dim, bias=False)  # down (output) projection
        self.w3 = Linear(dim, hidden_dim, bias=False)  # up
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.w2(F.silu(self.w1(x)) * self.w3(x)))


class TransformerBlock(nn.Module):
    # activation checkpointing (Transformer.activation_checkpointing): in training the block keeps
    # only its input and recomputes its activations in backward. It is applied inside forward, so
    # the module tree and the state_dict keys stay as they are and hooks on the block (FSDP2's
    # fully_shard) run outside the recomputed region.
    checkpointed = False

    def __init__(self, layer_id: int, args: ModelArgs):
        super().__init__()
        self.layer_id = layer_id
        self.attention = Attention(args, layer_id)
        self.feed_forward = FeedForward(args.dim, args.ffn_hidden_dim(), args.dropout)
        self.attention_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.ffn_norm = RMSNorm(args.dim, eps=args.norm_eps)

    def forward(self, x, *args, **kwargs):
        if self.checkpointed and torch.is_grad_enabled():
            # the recomputation draws the same dropout masks: checkpoint restores the RNG state
            # for it (and puts the state after the forward pass back afterwards)
            return torch.utils.checkpoint.checkpoint(self._forward, x, *args, use_reentrant=False, **kwargs)
        return self._forward(x, *args, **kwargs)

    def _forward(self, x, cos, sin, attend=None, kv_cache=None):
        h = x + self.attention(self.attention_norm(x), cos, sin, attend, kv_cache)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    last_loss: Optional[torch.Tensor]

    def __init__(self, params: ModelArgs):
        super().__init__()
        self.params = params
        self.vocab_size = params.vocab_size
        self.n_layers = params.n_layers
        self.tok_embeddings = nn.Embedding(params.vocab_size, params.dim)
        self.dropout = nn.Dropout(params.dropout)
        self.layers = nn.ModuleList(TransformerBlock(i, params) for i in range(params.n_layers))
        self.norm = RMSNorm(params.dim, eps=params.norm_eps)
        self.output = Linear(params.dim, params.vocab_size, bias=False)
        if params.tie_embeddings:
            # weight tying (https://paperswithcode.com/method/weight-tying), as llama2.c
            self.tok_embeddings.weight = self.output.weight
        cos, sin = precompute_freqs_cis(params.dim // params.n_heads, params.max_seq_len, params.rope_theta)
        self.register_buffer("freqs_cos", cos, persistent=False)
        self.register_buffer("freqs_sin", sin, persistent=False)

        self.apply(self._init_weights)
        # GPT-2 style scaled init of the residual output projections. llama2.c scales `w3` (an
        # input projection of SwiGLU) instead of `w2`; we scale the real output projections.
        for pn, p in self.named_parameters():
            if pn.endswith("attention.wo.weight") or pn.endswith("feed_forward.w2.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * params.n_layers))
        self.last_loss = None
        # the attention backend (tinylab/nn/attention/: auto or a registered name): a setting of
        # the run that finetune_t0.py sets (its `attention_impl` key), not of the model's shape
        self.attention_impl = "auto"

    @property
    def activation_checkpointing(self):
        """Per-block activation checkpointing (torch.utils.checkpoint, non-reentrant) in training:
        less memory for one more forward pass of the blocks. A setting of the run, not of the
        model's shape: the trainer sets it (the `activation_checkpointing` key); checkpoints and
        model_args do not record it."""
        return any(layer.checkpointed for layer in self.layers)

    @activation_checkpointing.setter
    def activation_checkpointing(self, on):
        for layer in self.layers:
            layer.checkpointed = bool(on)

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if getattr(module, "bias", None) is not None:
                torch.nn.init.zeros_(module.bias)

    # ------------------------------------------------------------------ forward

    def _rope_tables(self, seqlen, position_ids, start):
        if position_ids is None:
            if start + seqlen > self.params.max_seq_len:
                raise ValueError(f"sequence of {start + seqlen} tokens exceeds max_seq_len={self.params.max_seq_len}")
            cos = self.freqs_cos[start:start + seqlen]
            sin = self.freqs_sin[start:start + seqlen]
            return cos[None, :, None, :], sin[None, :, None, :]
        # per-token positions (B, T): packed examples restart at 0, left-padded prompts shift
        return self.freqs_cos[position_ids][:, :, None, :], self.freqs_sin[position_ids][:, :, None, :]

    def _attention_dropout(self):
        return self.params.dropout if self.training else 0.0

    def packed_attention(self, device):
        """The backend's name packed rows on `device` run under self.attention_impl (one of
        tinylab.nn.attention.choices()): auto = FlexAttention on CUDA (its compiled kernel skips
        the masked blocks), SDPA elsewhere (torch 2.13 has no FlexAttention backward on the CPU)
        and with attention dropout (flex has none). A backend that cannot run them is a ValueError."""
        impl = resolve(self.attention_impl, device.type, self._attention_dropout())
        problem = ATTENTION.get(impl)().problem(self._attention_dropout())
        if problem:
            raise ValueError(problem)
        return impl

    def _attend(self, tokens, attn_mask, segment_ids, prefix_mask, kv_cache) -> Attend:
        """The attention of one forward, shared by every layer: the backend attention_impl names
        (tinylab/nn/attention/) and its mask, built once here. Packed rows (segment_ids) get the
        backend's own mask; an explicit attn_mask (B, T, S) is shared by all heads as
        (B, 1, T, S); none means causal."""
        device = tokens.device
        if segment_ids is None:
            backend = ATTENTION.get(resolve(self.attention_impl, device.type, self._attention_dropout()))()
            if attn_mask is not None and attn_mask.dim() == 3:
                attn_mask = attn_mask.unsqueeze(1)
            if attn_mask is not None and kv_cache is not None and attn_mask.dtype == torch.bool:
                # decoding: made additive once here, where SDPA would convert it in every layer
                attn_mask = additive_mask(attn_mask, self._attention_dtype(device))
            return Attend(backend, attn_mask)
        if attn_mask is not None or kv_cache is not None:
            raise ValueError("segment_ids make the attention mask: pass no attn_mask or kv_cache with them")
        backend = ATTENTION.get(self.packed_attention(device))()
        return Attend(backend, backend.packed_mask(segment_ids, prefix_mask, self._attention_dtype(device)))

    def _attention_dtype(self, device):
        """The dtype the attention computes in, for an additive mask: the weights', or autocast's."""
        dtype = self.tok_embeddings.weight.dtype
        if torch.is_autocast_enabled(device.type) and dtype == torch.float32:
            dtype = torch.get_autocast_dtype(device.type)
        return dtype

    def _trunk(self, tokens, attn_mask=None, position_ids=None, kv_cache=None, collect=None,
               segment_ids=None, prefix_mask=None):
        """Embedding and all blocks; returns the final hidden states before the last norm."""
        start = kv_cache.length if kv_cache is not None else 0
        cos, sin = self._rope_tables(tokens.shape[1], position_ids, start)
        attend = self._attend(tokens, attn_mask, segment_ids, prefix_mask, kv_cache)
        h = self.dropout(self.tok_embeddings(tokens))
        for layer in self.layers:
            h = layer(h, cos, sin, attend, kv_cache)
            if collect is not None:
                collect.append(h)
        if kv_cache is not None:
            kv_cache.length += tokens.shape[1]
        return h

    def forward(self, tokens, targets=None, attn_mask=None, position_ids=None,
                loss_weights=None, kv_cache=None, all_logits=False, return_logits=True,
                segment_ids=None, prefix_mask=None):
        """llama2.c convention: with `targets` return logits for every position and set
        `self.last_loss` (mean cross-entropy, targets of -1 ignored; with `loss_weights` the
        weighted *sum* of per-token losses instead); without targets return only the
        last position's logits unless `all_logits=True`.

        return_logits=False (the training loop, loss evaluations): only `last_loss` is wanted, so
        the head and the loss are fused (linear_cross_entropy) and None is returned.

        attn_mask: bool (B, T, S) or (B, 1, T, S), True = may attend; None means causal.
        position_ids: long (B, T) RoPE positions; None means 0..T-1 (offset by the KV cache).
        segment_ids: long (B, T), packed rows (instead of attn_mask): 1, 2, ... per example, 0 on
        padding; each example attends within itself, causally or, where prefix_mask (B, T) bool
        marks its input tokens, both ways among those (nn.attention.document_mask). The mask is
        built here per forward by the attention backend (attention_impl); pass the examples' own position_ids too.
        """
        h = self.norm(self._trunk(tokens, attn_mask, position_ids, kv_cache, segment_ids=segment_ids, prefix_mask=prefix_mask))
        if targets is not None and not return_logits:
            self.last_loss = linear_cross_entropy(h.reshape(-1, h.shape[-1]), self.output.weight,
                                                  targets.reshape(-1), None if loss_weights is None else loss_weights.reshape(-1))
            return None
        if targets is not None:
            logits = self.output(h)
            if loss_weights is None:
                self.last_loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
            else:
                ce = F.cross_entropy(logits.view(-1, logits.size(-1)).to(compute_dtype(logits)), targets.reshape(-1).clamp_min(0), reduction="none")
                self.last_loss = (ce * loss_weights.reshape(-1).to(ce.dtype)).sum()
            return logits
        self.last_loss = None
        if all_logits:
            return self.output(h)
        return self.output(h[:, [-1], :])  # inference: only the last position is needed

    @torch.no_grad()
    def hidden_states(self, tokens, attn_mask=None, position_ids=None, segment_ids=None,
                      prefix_mask=None) -> List[torch.Tensor]:
        """Output of every transformer block (before the final norm), one (B, T, dim) per layer."""
        collect = []
        self._trunk(tokens, attn_mask, position_ids, collect=collect, segment_ids=segment_ids, prefix_mask=prefix_mask)
        return collect

    # ------------------------------------------------------------------ sizes

    def num_params(self, non_embedding=False):
        """Parameters counted once (a tied embedding/head matrix is one matrix)."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.tok_embeddings.weight.numel()
        return n

    def flops_per_token(self, seq_len=None):
        """Training FLOPs per token (forward + backward), PaLM appendix B: 6N + 12·L·H·Q·T, where
        N counts the parameters used in matmuls (the head yes, the embedding lookup no)."""
        p = self.params
        T = p.max_seq_len if seq_len is None else seq_len
        N = self.num_params(non_embedding=True)
        if p.tie_embeddings:
            N += self.output.weight.numel()  # the shared matrix still does the head matmul
        else:
            N = self.num_params() - self.tok_embeddings.weight.numel()
        head_dim = p.dim // p.n_heads
        return 6 * N + 12 * p.n_layers * p.n_heads * head_dim * T

    def estimate_mfu(self, tokens_per_iter, dt, peak_flops, seq_len=None):
        """Model FLOPs utilisation: achieved FLOP/s over the device's peak FLOP/s."""
        if not peak_flops or dt <= 0:
            return None
        return self.flops_per_token(seq_len) * tokens_per_iter / dt / peak_flops

    # ------------------------------------------------------------------ generation

    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, prompt_mask=None,
                 generator=None, stop_token=None):
        """Sample up to `max_new_tokens` after the prompts `idx` (B, T); temperature 0 is greedy.

        Prompts of different lengths are left-padded and marked by `prompt_mask` (B, T, True on
        real tokens): padding is never attended to and positions start at each prompt's first
        real token, so every row is generated exactly as if it were alone.

        Context window (L = max_seq_len). A row's next token is predicted from a window of its
        last tokens at positions 0, 1, ... from the window's first token, decoded one token per
        step over a KV cache. While a row holds at most L tokens the window is all of them (what
        llama2.c's generate computes too). When one more token would make the window longer
        than L, it restarts from the row's last L // 2 tokens: those are re-encoded in one
        forward pass (a refill: fresh keys and values, positions from 0 again) and decoding
        continues cached, so past L a row refills every L - L // 2 + 1 tokens and always sees
        between L // 2 and L of its last tokens. (llama2.c re-encodes the last L tokens at every
        step past L: L times the work per token.) A prompt longer than L starts from its last L.

        Stopping. With `stop_token` (the generation evaluation passes BOS, which starts the next
        story), a row ends when it samples that token: the token is kept and every later
        position of the row holds stop_token too. Every 16 steps (the only host sync) generation
        stops when all rows have ended, and the output is cut after the last row's stop token;
        the generator is then advanced as if every step had been sampled, so what is drawn from
        it afterwards does not depend on when the batch stopped.

        Returns (B, T + n) with the prompts included: n = max_new_tokens unless all rows ended.
        """
        # inference_mode: no autograd bookkeeping (8% of a 16-row decoding step on the CPU); the
        # returned tokens are an ordinary tensor, so callers may feed them back into training
        with torch.inference_mode():
            out = self._generate(idx, max_new_tokens, temperature, top_k, prompt_mask, generator, stop_token)
        return out.clone() if torch.is_inference(out) else out

    def _generate(self, idx, max_new_tokens, temperature, top_k, prompt_mask, generator, stop_token):
        B, T = idx.shape
        if max_new_tokens <= 0:
            return idx
        dev, new = idx.device, max_new_tokens
        windows = Windows(self._left_padding(idx, prompt_mask), T, self.params.max_seq_len, new)
        windows.positions = windows.positions.to(dev)
        cache = KVCache(self.params, B, windows.capacity, dev, next(self.parameters()).dtype)
        out = torch.empty(B, T + new, dtype=idx.dtype, device=dev)
        out[:, :T] = idx
        done = torch.zeros(B, dtype=torch.bool, device=dev)
        logits = self._encode_prompts(idx, windows, cache)
        step = 0
        while True:
            next_tok = next_tokens(logits, temperature, top_k, generator)
            if stop_token is not None:
                next_tok = next_tok.masked_fill(done[:, None], stop_token)
                done |= next_tok[:, 0] == stop_token
            out[:, T + step] = next_tok[:, 0]
            step += 1
            if step == new:
                break
            if stop_token is not None and step % 16 == 0 and bool(done.all()):
                if temperature != 0.0:  # the draws the remaining steps would have made
                    skip_draws(new - step, B, dev, generator)
                break
            logits = self._feed_token(out, step, windows, cache, done if stop_token is not None else None)
        if stop_token is not None and bool(done.all()):
            # cut after the last row's stop token (the same whenever the check ran)
            ended = (out[:, T:T + step] == stop_token).int().argmax(1)
            step = int(ended.max()) + 1
        return out[:, :T + step]

    @staticmethod
    def _left_padding(idx, prompt_mask):
        """Each row's count of left-padding tokens (prompt_mask: True on real tokens)."""
        B, T = idx.shape
        if prompt_mask is None:
            return [0] * B
        real = prompt_mask.to(device=idx.device, dtype=torch.bool)
        count = real.sum(1)
        if not torch.equal(real, torch.arange(T, device=idx.device)[None] >= (T - count)[:, None]) or not bool(count.all()):
            raise ValueError("prompt_mask must mark at least one real token per row, after its left padding")
        return (T - count).tolist()  # the one host read of the set-up

    def _encode_prompts(self, idx, windows, cache):
        """Step 0: the prompts' windows into the cache; the last position's logits (B, V). Masks
        and positions only where rows differ (padding, prompts cropped differently)."""
        mask, pos, filled = windows.prompt_mask(idx.device)
        if filled is not None:
            cache.key_valid[:, :filled.shape[1]] = filled
        logits = self(idx[:, windows.c0:], attn_mask=mask, position_ids=pos, kv_cache=cache)[:, -1, :]
        if bool(logits.isnan().any()):  # sample_tokens would draw from NaNs without complaint
            raise ValueError("the model's logits are NaN: its weights are not finite")
        return logits

    def _feed_token(self, out, step, windows, cache, done):
        """Feed the token sampled at `step` - 1 (column n) over the cache: one-token forward
        passes, except for the rows whose window restarts here (refills), which are re-encoded
        from their last `keep` tokens. Returns the next logits (B, V)."""
        B, n, c0 = out.shape[0], windows.T + step - 1, windows.c0
        rows = windows.refills.get(step, [])
        if rows:
            windows.plain = False  # windows differ from here on: masks and positions from the schedule
            if done is not None:  # ended rows are not worth a refill
                live = (~done).tolist()
                rows = [i for i in rows if live[i]]
        logits = None
        if len(rows) < B:
            cache.key_valid[:, (n - c0) % cache.capacity] = True
            mask = pos = None
            if not windows.plain:
                mask, pos = cache.key_valid[:, None, :cache.filled(1)], windows.positions[step - 1, :, None]
            logits = self(out[:, n:n + 1], attn_mask=mask, position_ids=pos, kv_cache=cache)[:, -1, :]
        else:  # every row refills: nothing to decode
            cache.length += 1
        if rows:
            logits = self._refill(out, torch.tensor(rows, device=out.device), n, windows, cache, logits)
        return logits

    def _refill(self, out, rows, n, windows, cache, logits):
        """Re-encode rows `rows` from their last `keep` tokens (fresh keys and values, positions
        from 0) into their cache slots; their decoding (if any) is discarded: the re-encoding
        replaces their logits, their cached keys/values and their window's mask."""
        keep = windows.keep
        sub = KVCache(self.params, len(rows), keep, out.device, cache.k.dtype)
        sub_logits = self(out[rows, n - keep + 1:n + 1], kv_cache=sub)[:, -1, :]
        if logits is None:
            logits = sub_logits
        else:
            logits[rows] = sub_logits
        slots = (torch.arange(n - keep + 1, n + 1, device=out.device) - windows.c0) % cache.capacity
        cache.copy_rows(rows, slots, sub)
        cache.key_valid[rows] = False
        cache.key_valid[rows[:, None], slots[None, :]] = True
        return logits
