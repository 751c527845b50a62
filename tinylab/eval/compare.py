"""Where did fine-tuning change the model? Two measures between checkpoints of one shape
(evaluation/compare_checkpoints.py; docs/evaluation.md):

  - relative weight change ||W_b - W_a|| / ||W_a|| (Frobenius) of every tensor, by model.py's
    names, and of the whole model (all tensors as one vector; a tied embedding counted once);
  - linear CKA (Kornblith et al. 2019) of the hidden states on the same prompts: the embedding
    output and every block's output (before the final norm), one row per real token.

Layout of the tables and heat maps: one row per place in the model (embedding, layer 0..L-1,
final norm, and the output head when untied), one column per block module (BLOCK_MODULES); the
non-block tensors (tok_embeddings, norm, output) sit in the last column, OWN.

The tool's own flags (COMPARE_KEYS, with check_compare) are declared here; schema.py adds them to
the evaluation tools' shared ones (keys.py) as COMPARE.
"""
import math

import torch

from tinylab.core.config import Key
from tinylab.core.errors import UserError
from tinylab.core.fileio import atomic_file
from tinylab.eval.common import right_pad

BLOCK_MODULES = ("attention.wq", "attention.wk", "attention.wv", "attention.wo", "feed_forward.w1",
                 "feed_forward.w2", "feed_forward.w3", "attention_norm", "ffn_norm")
SHORT = {m: m.split(".")[-1] for m in BLOCK_MODULES} | {"attention_norm": "attn_norm"}
OWN = "emb/norm/out"  # the column of the row's own tensor outside the blocks
OUTSIDE = {"tok_embeddings": "embedding", "norm": "final norm", "output": "output"}


# ---------------------------------------------------------------------- the tool's flags

def _check_pairs(pairs):
    for p in pairs:
        a, sep, b = p.partition(":")
        if not (sep and a.strip().isdigit() and b.strip().isdigit()) or int(a) == int(b):
            return f"{p!r} is not a pair A:B of two different checkpoint positions (0 = the first), e.g. 0:1"
    return None


# its checkpoints are positional (two or more), not --checkpoint; --out is the comparison's JSON
COMPARE_OUT = Key("out", "", "also write the JSON to this file (an existing one only with --force)", output="json")
COMPARE_KEYS = [
    Key("dataset", "", "pretokenized dataset (in the first checkpoint's data cache) whose test examples are the "
        "prompts; '' = the dataset the first checkpoint was trained on"),
    Key("prompts", "", "instead of --dataset: a prompt file (plain text: one per line; .jsonl: a 'text' field "
        "or a JSON string per line)", input=True),
    Key("num_prompts", 64, "prompts: a seeded choice of test examples of --dataset, or the first N of --prompts",
        range="[1, inf)"),
    Key("story_only", False, "--dataset: BOS + the story (the probes' inputs) instead of the whole example"),
    Key("pairs", [], "pairs to compare as A:B positions (0 = the first checkpoint), e.g. 0:1,1:2; [] = each "
        "consecutive pair and each checkpoint against the first", check=_check_pairs),
    Key("labels", [], "names of the checkpoints in the outputs, one each; [] = their run folders' names"),
    Key("plot", "", "also draw the heat maps to this PNG (an existing one only with --force)", output="png"),
    Key("force", False, "replace an existing --out / --plot"),
]


def check_compare(cfg):
    if cfg["dataset"] and cfg["prompts"]:
        raise UserError("--dataset and --prompts both name the prompts; pass one of them")


# ---------------------------------------------------------------------- the measures

def linear_cka(x: torch.Tensor, y: torch.Tensor) -> float:
    """Linear CKA of two representations of the same n examples, x (n, d1) and y (n, d2):
    ||Yc^T Xc||_F^2 / (||Xc^T Xc||_F ||Yc^T Yc||_F) with column-centred Xc, Yc (Kornblith et al.
    2019, eq. 5; the feature-space form of HSIC(XX^T, YY^T) normalised). In float64; nan when a
    representation is constant."""
    x = x.double() - x.double().mean(dim=0)
    y = y.double() - y.double().mean(dim=0)
    den = torch.linalg.matrix_norm(x.T @ x) * torch.linalg.matrix_norm(y.T @ y)
    return float(torch.linalg.matrix_norm(y.T @ x) ** 2 / den) if den > 0 else math.nan


def place(name: str):
    """(row, column) of a parameter: layers.3.attention.wq.weight -> ("layer 3", "attention.wq");
    tok_embeddings.weight -> ("embedding", OWN)."""
    parts = name.split(".")[:-1]  # without .weight
    if parts[0] == "layers":
        return f"layer {parts[1]}", ".".join(parts[2:])
    return OUTSIDE[parts[0]], OWN


def relative_change(a: torch.Tensor, b: torch.Tensor):
    """||b - a|| / ||a|| in float64; None when ||a|| = 0 (undefined)."""
    a, b = a.double(), b.double()
    norm = torch.linalg.vector_norm(a)
    return float(torch.linalg.vector_norm(b - a) / norm) if norm > 0 else None


def compared_tensors(model):
    """The model's parameters by name, a tied output head left out (it is tok_embeddings)."""
    return {k: v for k, v in model.state_dict().items()
            if not (k == "output.weight" and model.params.tie_embeddings)}


def weight_changes(model_a, model_b):
    """([{param, row, module, rel_change}], whole-model relative change)."""
    ta, tb = compared_tensors(model_a), compared_tensors(model_b)
    rows, diff, norm = [], 0.0, 0.0
    for name, a in ta.items():
        row, module = place(name)
        rows.append({"param": name, "row": row, "module": module, "rel_change": relative_change(a, tb[name])})
        diff += float(torch.linalg.vector_norm(tb[name].double() - a.double()) ** 2)
        norm += float(torch.linalg.vector_norm(a.double()) ** 2)
    return rows, (math.sqrt(diff / norm) if norm > 0 else None)


def shape_of(model) -> str:
    p = model.params
    return (f"dim={p.dim} n_layers={p.n_layers} n_heads={p.n_heads} n_kv_heads={p.kv_heads()} "
            f"hidden_dim={p.ffn_hidden_dim()} vocab_size={p.vocab_size} tie_embeddings={p.tie_embeddings}")


def check_same_shape(models, paths):
    """A one-line UserError naming the two shapes when a model's tensors differ from the first's."""
    ref = {k: tuple(v.shape) for k, v in compared_tensors(models[0]).items()}
    for model, path in zip(models[1:], paths[1:]):
        own = {k: tuple(v.shape) for k, v in compared_tensors(model).items()}
        if own != ref:
            a, b = shape_of(models[0]), shape_of(model)
            if a == b:  # same arguments, other tensors: name the first that differs
                k = next(k for k in sorted(ref.keys() | own.keys()) if ref.get(k) != own.get(k))
                a, b = f"{k} {ref.get(k)}", f"{k} {own.get(k)}"
            raise UserError(f"{paths[0]} ({a}) and {path} ({b}) have different shapes; weights and hidden states "
                            f"can only be compared between checkpoints of one shape")


@torch.no_grad()
def hidden_states(model, sequences, batch_size=8):
    """[embedding output, block 0 output, ...], each (real tokens of all sequences, dim) float32
    on the CPU. Right padding leaves the real positions untouched (causal attention)."""
    device = next(model.parameters()).device
    states = [[] for _ in range(model.params.n_layers + 1)]
    for start in range(0, len(sequences), batch_size):
        chunk = sequences[start:start + batch_size]
        tokens = right_pad(chunk).to(device)
        # the embedding output as _trunk computes it (dropout is off in eval mode)
        hs = [model.tok_embeddings(tokens)] + model.hidden_states(tokens)
        for layer, h in enumerate(hs):
            states[layer] += [h[i, :len(s)].float().cpu() for i, s in enumerate(chunk)]
    return [torch.cat(s) for s in states]


def state_names(n_layers):
    return ["embedding"] + [f"layer {i}" for i in range(n_layers)]


# ---------------------------------------------------------------------- the comparison

def default_pairs(n):
    """Each consecutive pair, then each checkpoint against the first."""
    return [(i, i + 1) for i in range(n - 1)] + [(0, j) for j in range(2, n)]


def parse_pairs(texts, n):
    """--pairs (['0:1', '1:2'], checked for form by _check_pairs) -> [(0, 1), (1, 2)] within n."""
    pairs = [tuple(int(v) for v in t.split(":")) for t in texts]
    for t, (a, b) in zip(texts, pairs):
        if max(a, b) >= n:
            raise UserError(f"--pairs={t}: there are only {n} checkpoints (positions 0-{n - 1})")
    return pairs or default_pairs(n)


def compare(models, labels, sequences, pairs, batch_size=8):
    """The result object (the JSON): per pair the weight changes and per hidden state the CKA."""
    states = [hidden_states(m, sequences, batch_size) for m in models]
    names = state_names(models[0].params.n_layers)
    out = []
    for a, b in pairs:
        weights, whole = weight_changes(models[a], models[b])
        cka = [{"state": name, "cka": _finite(linear_cka(states[a][i], states[b][i]))} for i, name in enumerate(names)]
        out.append({"a": labels[a], "b": labels[b], "a_index": a, "b_index": b, "whole_model": whole,
                    "weights": weights, "cka": cka})
    return {"shape": shape_of(models[0]), "tokens": int(states[0][0].shape[0]), "pairs": out}


def _finite(v):
    return None if v is None or not math.isfinite(v) else v


def grid(pair, n_layers, tied):
    """(row names, column names, {(row, column): rel_change}, {row: cka}) of one pair."""
    rows = ["embedding"] + [f"layer {i}" for i in range(n_layers)] + ["final norm"] + ([] if tied else ["output"])
    cells = {(w["row"], w["module"]): w["rel_change"] for w in pair["weights"]}
    return rows, list(BLOCK_MODULES) + [OWN], cells, {c["state"]: c["cka"] for c in pair["cka"]}


def _fmt(v, width=10):
    return f"{'-' if v is None else f'{v:.4f}':>{width}}"


def format_table(result, n_layers, tied) -> str:
    """The printed tables, one per pair."""
    lines = []
    for pair in result["pairs"]:
        rows, cols, cells, cka = grid(pair, n_layers, tied)
        lines += ["", f"{pair['a']} -> {pair['b']}: relative weight change ||B - A|| / ||A|| (whole model "
                      f"{_fmt(pair['whole_model'], 0)}); CKA of the row's hidden state",
                  f"{'':<11}" + "".join(f"{SHORT[c]:>10}" for c in cols[:-1]) + f"{OWN:>14}       CKA"]
        for r in rows:
            vals = "".join(_fmt(cells[(r, c)]) if (r, c) in cells else " " * 10 for c in cols[:-1])
            own = _fmt(cells[(r, OWN)], 14) if (r, OWN) in cells else " " * 14
            lines.append(f"{r:<11}{vals}{own}" + (_fmt(cka[r]) if r in cka else ""))
    return "\n".join(lines[1:])


def plot(result, n_layers, tied, path):
    """Heat maps, atomically written PNG: per pair the relative weight change (log colour scale,
    one scale for all pairs, values written in the cells), and one map of the CKA per hidden state
    (rows) and pair (columns)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import LogNorm

    pairs = result["pairs"]
    rows, cols, _, _ = grid(pairs[0], n_layers, tied)
    changes = np.full((len(pairs), len(rows), len(cols)), np.nan)
    cka = np.full((len(rows), len(pairs)), np.nan)
    for k, pair in enumerate(pairs):
        _, _, cells, ck = grid(pair, n_layers, tied)
        for (r, c), v in cells.items():
            changes[k, rows.index(r), cols.index(c)] = np.nan if v is None else v
        for r, v in ck.items():
            cka[rows.index(r), k] = np.nan if v is None else v
    positive = changes[np.isfinite(changes) & (changes > 0)]
    norm = LogNorm(vmin=positive.min(), vmax=positive.max()) if positive.size and positive.min() < positive.max() \
        else None
    n_panels = len(pairs) + 1
    ncols = min(n_panels, 2)
    nrows = math.ceil(n_panels / ncols)
    height = 0.9 + 0.32 * len(rows)
    fig, axes = plt.subplots(nrows, ncols, figsize=(6.2 * ncols, height * nrows), squeeze=False)
    for k, pair in enumerate(pairs):
        ax = axes.flat[k]
        shown = np.where(changes[k] > 0, changes[k], np.nan) if norm else changes[k]
        im = ax.imshow(shown, aspect="auto", cmap="magma_r", norm=norm)
        _annotate(ax, im, changes[k], "{:.3g}")
        ax.set_title(f"{pair['a']} -> {pair['b']}: ||B - A|| / ||A|| (whole {_fmt(pair['whole_model'], 0).strip()})",
                     fontsize=9)
        _ticks(ax, rows, [SHORT.get(c, c) for c in cols])
        fig.colorbar(im, ax=ax, fraction=0.04, pad=0.02)
    ax = axes.flat[len(pairs)]
    finite = cka[np.isfinite(cka)]
    im = ax.imshow(cka, aspect="auto", cmap="viridis", vmin=min(finite.min(), 0.9) if finite.size else 0, vmax=1)
    _annotate(ax, im, cka, "{:.4f}")
    ax.set_title(f"linear CKA of the hidden states ({result['tokens']} tokens)", fontsize=9)
    _ticks(ax, rows, [f"{p['a']}\n-> {p['b']}" for p in pairs])
    fig.colorbar(im, ax=ax, fraction=0.04, pad=0.02)
    for ax in list(axes.flat)[n_panels:]:
        ax.axis("off")
    fig.tight_layout()
    with atomic_file(path, parents=True) as f:
        fig.savefig(f, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)


def _ticks(ax, rows, cols):
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.set_xticks(range(len(cols)), cols, fontsize=7, rotation=0 if max(len(c) for c in cols) < 12 else 30)


def _annotate(ax, im, values, fmt):
    """Each finite value written in its cell, black on light colours and white on dark ones."""
    import numpy as np
    im.autoscale_None()  # the colour limits from the whole image, not from the first value normalised
    for (i, j), v in np.ndenumerate(values):
        if np.isfinite(v):
            r, g, b, _ = im.cmap(im.norm(v)) if v > 0 or im.norm.vmin <= 0 else im.cmap(0.0)
            ax.text(j, i, fmt.format(v), ha="center", va="center", fontsize=6,
                    color="black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white")
