"""Model shapes as the planner names, keys and prices them: FLOPs per iteration and parameter
counts of a shape at the runs' batch and sequence length (Transformer.flops_per_token on a
meta-device model: 6N + 12·L·d·T per token, PaLM app. B)."""
from tinylab.growth.ops.base import meta_model

FLOPS_FORMULA = "model.flops_per_token(max_seq_len) x tokens per iteration (6N + 12*L*d*T per token, PaLM app. B)"
N_DEFINITION = "non-embedding parameters (Transformer.num_params(non_embedding=True), Kaplan's N)"


def shape_key(args):
    return (args.dim, args.n_layers, args.n_heads, args.kv_heads(), args.ffn_hidden_dim(), args.vocab_size,
            bool(args.tie_embeddings))


def shape_dict(args):
    return {"dim": args.dim, "n_layers": args.n_layers, "n_heads": args.n_heads, "n_kv_heads": args.kv_heads(),
            "hidden_dim": args.ffn_hidden_dim(), "vocab_size": args.vocab_size, "tie_embeddings": bool(args.tie_embeddings)}


def shape_text(args):
    return f"d{args.dim} L{args.n_layers} h{args.n_heads} f{args.ffn_hidden_dim()}"


def shape_text_from(d):
    return f"d{d['dim']} L{d['n_layers']} h{d['n_heads']} f{d['hidden_dim']}"


def tokens_per_iter(cfg):
    """Tokens per optimizer step (all processes): gradient_accumulation_steps counts micro-steps
    over all processes, as in Trainer.tokens_per_iter."""
    return cfg["gradient_accumulation_steps"] * cfg["batch_size"] * cfg["max_seq_len"]


class Costs:
    """Training FLOPs per iteration of a model shape at the runs' batch and sequence length,
    from Transformer.flops_per_token on a meta-device model (as ops.base.meta_model builds it)."""

    def __init__(self, seq_len, tokens):
        self.seq_len, self.tokens, self.cache = seq_len, tokens, {}

    def model(self, args):
        key = shape_key(args)
        if key not in self.cache:
            m = meta_model(args)
            self.cache[key] = (m.flops_per_token(self.seq_len) * self.tokens, m.num_params(),
                               m.num_params(non_embedding=True))
        return self.cache[key]

    def per_iter(self, args):
        return self.model(args)[0]

