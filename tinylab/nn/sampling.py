"""Generation's pieces (model.Transformer.generate puts them together): drawing the next tokens
from the logits, the KV cache, and the schedule of the rows' context windows."""
import torch
import torch.nn.functional as F


def _sampling_dtype(device):
    # fp64 where the device has it (MPS has no float64)
    return torch.float32 if torch.device(device).type == "mps" else torch.float64


def _uniforms(n, device, generator):
    return torch.rand(n, 1, dtype=_sampling_dtype(device), device=device, generator=generator)


def sample_tokens(probs, generator=None):
    """One token per row of `probs` (B, V), (B, 1) long: the first index whose cumulative
    probability exceeds u * (the row's total), u one uniform draw per row from `generator`.

    Inverting the CDF takes B draws where torch.multinomial takes one exponential per entry
    (B * V: 3.3 ms of a 16-row decoding step at vocabulary 8192 on the CPU, against 0.2 ms
    here). The CDF is summed in fp64 (an fp32 running sum over 32000 entries drifts by ~1e-5,
    more than a rare token's probability); an entry of probability 0 is never drawn."""
    cdf = probs.to(_sampling_dtype(probs.device)).cumsum(-1)
    u = _uniforms(probs.shape[0], probs.device, generator)
    total = cdf[:, -1:].contiguous()
    # u * total may round up to total itself: then the last entry of nonzero probability
    last = torch.searchsorted(cdf, total)
    return torch.minimum(torch.searchsorted(cdf, u * total, right=True), last)


def next_tokens(logits, temperature, top_k=None, generator=None):
    """(B, 1) tokens from the last position's logits (B, V): the argmax at temperature 0, else a
    draw from softmax(logits / temperature), restricted to the top_k largest if given."""
    if temperature == 0.0:
        return torch.argmax(logits, dim=-1, keepdim=True)
    logits = logits.float() / temperature
    if top_k is not None:
        v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
        logits[logits < v[:, [-1]]] = -float("inf")
    return sample_tokens(F.softmax(logits, dim=-1), generator)


def skip_draws(steps, rows, device, generator):
    """Advance `generator` as `steps` sampled steps of `rows` rows would."""
    for _ in range(steps):
        _uniforms(rows, device, generator)


class KVCache:
    """Preallocated keys/values of every layer for incremental decoding, kept in a ring of
    `capacity` slots: the i-th position written goes to slot i % capacity, so a context window
    that slides past `capacity` overwrites its oldest positions instead of growing.

    `length` counts the positions written so far. `key_valid` (B, capacity) is the caller's mask
    of which slots each row may attend to (generate keeps it: padding, the window's start).
    `args`: the model's ModelArgs.
    """

    def __init__(self, args, batch_size: int, capacity: int, device, dtype):
        head_dim = args.dim // args.n_heads
        shape = (args.n_layers, batch_size, args.kv_heads(), capacity, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.key_valid = torch.ones(batch_size, capacity, dtype=torch.bool, device=device)
        self.capacity = capacity
        self.length = 0

    def filled(self, new=0):
        """Slots holding a position once `new` more are written (all of them after a wrap)."""
        return min(self.length + new, self.capacity)

    def update(self, layer_id: int, k, v):
        """Store k, v (B, kv_heads, T, hd) at the next slots; return every filled slot. Several
        positions at once (a prefill) must fit before the ring's end."""
        start = self.length % self.capacity
        end = start + k.shape[2]
        if end > self.capacity:
            raise ValueError(f"{k.shape[2]} new positions at slot {start} overrun a KV cache of {self.capacity}")
        self.k[layer_id, :, :, start:end] = k
        self.v[layer_id, :, :, start:end] = v
        n = self.filled(k.shape[2])
        return self.k[layer_id, :, :, :n], self.v[layer_id, :, :, :n]

    def copy_rows(self, rows, slots, other: "KVCache"):
        """Put all of `other`'s positions (every layer) into rows `rows`, slots `slots` of this
        cache: (n,) and (other.length,) long tensors."""
        r, s = rows[:, None], slots[None, :]
        # advanced indices split by a slice: the result's dims are (rows, slots, layer, head, hd)
        self.k[:, r, :, s] = other.k[:, :, :, :other.length].permute(1, 3, 0, 2, 4)
        self.v[:, r, :, s] = other.v[:, :, :, :other.length].permute(1, 3, 0, 2, 4)


class Windows:
    """The rows' context windows over a whole generation, known in advance (generate's docstring
    says which tokens a window holds). Columns are the padded token indices, T the prompts' length,
    L = max_seq_len: a row's window holds columns [start, n] when column n is fed (step n - T + 1).
    It starts with the prompt's last L tokens at most (`start0`, from the left padding `pads`),
    and restarts at n - keep + 1 (keep = L // 2) when n - start reaches L.

    c0: the first column the cache holds; capacity: the cache's slots; positions (new - 1, B):
    the RoPE position of the column fed at steps 1 .. new - 1 (all below L); refills: {step: the
    rows whose window restarts at that step}; plain: every row's first window is the whole cache
    in order (unpadded prompts), so the first steps need no mask and no positions.
    """

    def __init__(self, pads, T: int, L: int, new: int):
        self.T, self.keep = T, max(1, L // 2)
        self.start0 = torch.tensor([max(p, T - L) for p in pads])
        self.c0 = int(self.start0.min())
        self.capacity = min(L, T - self.c0 + new - 1)
        cols = torch.arange(T, T + new - 1)[:, None]  # the column fed at steps 1 .. new - 1
        past = cols - self.start0[None] - L  # >= 0: the row has outgrown its first window
        period = L - self.keep + 1
        refill = (past >= 0) & (past % period == 0)
        start = torch.where(past >= 0, cols - self.keep + 1 - past.clamp_min(0) % period, self.start0[None])
        self.positions = cols - start
        self.refills = {}
        for s, row in refill.nonzero().tolist():
            self.refills.setdefault(s + 1, []).append(row)
        self.plain = bool((self.start0 == self.c0).all())

    def prompt_mask(self, device):
        """Step 0's mask (B, T - c0, T - c0) and positions (B, T - c0) over the prompts' windows,
        and which cache slots they fill (B, T - c0), or None, None, None where the windows are plain."""
        if self.plain:
            return None, None, None
        n = self.T - self.c0
        c = torch.arange(self.c0, self.T, device=device)[None] - self.start0.to(device)[:, None]
        window = c >= 0  # real and inside the window
        # causal & key-in-window; a padding query attends to itself so no row is empty
        causal = torch.ones(n, n, dtype=torch.bool, device=device).tril()
        mask = (causal[None] & window[:, None, :]) | torch.eye(n, dtype=torch.bool, device=device)[None]
        return mask, c.clamp_min(0), window
