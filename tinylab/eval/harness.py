"""lm-evaluation-harness on our checkpoints (evaluation/eval_harness.py; docs/evaluation.md,
"lm-evaluation-harness"): our model and the checkpoint's own sentencepiece tokenizer behind the
harness's `LM` interface, so any harness task runs on a checkpoint without an HF export.

The adapter computes what the harness's HFLM computes on the HF export of the same checkpoint
(tests/eval/test_eval_harness.py measures the agreement):
  loglikelihood          TemplateLM's pairs (context and continuation encoded together, BOS in
                         front, the context's trailing spaces moved to the continuation); requests
                         sorted longest first, right-padded, one forward pass per batch; a pair
                         longer than max_seq_len + 1 tokens loses tokens on the left
  loglikelihood_rolling  the document's tokens (no BOS of their own) cut into windows by
                         get_rolling_token_windows(max_seq_len, context_len=1) with BOS as the
                         prefix token, scored as loglikelihood requests and summed per document
  generate_until         contexts with BOS, cut on the left to max_seq_len - max_gen_toks tokens,
                         left-padded, decoded by model.generate over the KV cache (greedy unless
                         the task samples); a row ends at EOS and its text at the first `until`
lm_eval is imported inside the functions: tinylab imports without it (requirements-eval.txt).
"""
import torch
import torch.nn.functional as F

from tinylab.core.errors import UserError, first_line
from tinylab.eval.common import right_pad

INSTALL = "pip install -r requirements-eval.txt"
MAX_GEN_TOKS = 256  # HFLM's default when a task does not set max_gen_toks
SAMPLING_KWARGS = ("until", "max_gen_toks", "do_sample", "temperature", "top_k")
FIRST_CHUNK = 16  # generation checks its stop strings after 16, 32, 64, ... new tokens


def require_lm_eval():
    """The lm_eval package, or one error line naming the install command."""
    try:
        import lm_eval
        import lm_eval.api.model  # noqa: F401  (the LM classes the adapter builds on)
    except ImportError as e:
        raise UserError(f"lm-evaluation-harness is not installed ({first_line(e)}): {INSTALL}") from None
    return lm_eval


class HarnessAdapter:
    """Our model as the harness's LM. Mixed in front of lm_eval's TemplateLM by `harness_lm`
    (TemplateLM supplies `loglikelihood` and `_encode_pair`; this class everything model-side)."""

    backend = "causal"

    def __init__(self, model, tokenizer, batch_size=8, seed=1234, max_gen_toks=MAX_GEN_TOKS):
        super().__init__()
        self.model, self.tok, self._batch_size = model, tokenizer, batch_size
        self.max_length, self.max_gen_toks = model.params.max_seq_len, max_gen_toks
        self._device = next(model.parameters()).device  # LM.device reads it
        self.generator = torch.Generator(device=self._device).manual_seed(seed)
        sp = tokenizer.sp  # the ids HF's decode(skip_special_tokens=True) leaves out
        self._special = {i for i in range(sp.get_piece_size()) if sp.is_control(i) or sp.is_unknown(i)}

    @property
    def eot_token_id(self) -> int:
        return self.tok.eos_id

    @property
    def prefix_token_id(self) -> int:  # what an empty context and a document's first window start from
        return self.tok.bos_id

    def tok_encode(self, string, add_special_tokens=None, **kwargs) -> list:
        """BOS in front unless add_special_tokens=False (HFLM with add_bos_token=True)."""
        return self.tok.encode(string, bos=add_special_tokens is not False)

    def tok_decode(self, tokens) -> str:
        return self.tok.decode([t for t in tokens if t not in self._special])

    # ------------------------------------------------------------------ loglikelihood

    def _loglikelihood_tokens(self, requests, disable_tqdm=False, **kwargs):
        """[(log p(continuation | context), greedy?)] of ((strings), context ids, continuation ids)."""
        from lm_eval.models.utils import Collator
        order = Collator(requests, sort_fn=lambda r: (-len(r[1]) - len(r[2]), tuple(r[1] + r[2])))
        scores = []
        for chunk in order.get_batched(n=self._batch_size):
            scores.extend(self._score_batch([(ctx, cont) for _, ctx, cont in chunk]))
            for (strings, _, _), answer in zip(chunk, scores[-len(chunk):]):
                if strings is not None:
                    self.cache_hook.add_partial("loglikelihood", strings, answer)
        return order.get_original(scores)

    @torch.no_grad()
    def _score_batch(self, pairs):
        """One forward pass over right-padded rows: each row is context + continuation minus the
        last token, cut on the left to max_seq_len; the continuation's log-probs are its last ones."""
        L = self.max_length
        rows = [(ctx + cont)[-(L + 1):][:-1] for ctx, cont in pairs]
        for _, cont in pairs:
            if len(cont) > L:
                raise UserError(f"a continuation of {len(cont)} tokens is longer than the model's window "
                                f"(max_seq_len={L}); the harness cannot score it")
        logits = self.model(right_pad(rows).to(self._device), all_logits=True)
        out = []
        for i, (row, (_, cont)) in enumerate(zip(rows, pairs)):
            logp = F.log_softmax(logits[i, len(row) - len(cont):len(row)].float(), dim=-1)
            target = torch.tensor(cont, device=logp.device)
            out.append((float(logp.gather(1, target[:, None]).sum()), bool((logp.argmax(-1) == target).all())))
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        """Each document's total log-likelihood over disjoint windows of at most max_seq_len
        predicted tokens (the harness's perplexity tasks)."""
        from lm_eval import utils
        windows, owner = [], []
        for i, (text,) in enumerate(req.args for req in requests):
            tokens = self.tok_encode(text, add_special_tokens=False)
            for ctx, cont in map(utils.make_disjoint_window, utils.get_rolling_token_windows(
                    token_list=tokens, prefix_token=self.prefix_token_id, max_seq_len=self.max_length,
                    context_len=1)):
                windows.append((None, ctx, cont))
                owner.append(i)
        totals = [0.0] * len(requests)
        for i, (logp, _) in zip(owner, self._loglikelihood_tokens(windows)):
            totals[i] += logp
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    # ------------------------------------------------------------------ generation

    def generate_until(self, requests, disable_tqdm=False):
        """Each request's continuation, cut at the first of its `until` strings."""
        from lm_eval.models.utils import Collator
        order = Collator([req.args for req in requests], sort_fn=lambda r: (-len(self.tok_encode(r[0])), r[0]),
                         group_by="gen_kwargs", group_fn=lambda r: r[1])
        texts = []
        for chunk in order.get_batched(n=self._batch_size):
            contexts, kwargs = zip(*chunk)
            texts.extend(self._generate_batch(list(contexts), kwargs[0]))
            for args, text in zip(chunk, texts[-len(chunk):]):
                self.cache_hook.add_partial("generate_until", args, text)
        return order.get_original(texts)

    def _generate_batch(self, contexts, gen_kwargs):
        from lm_eval.models.utils import normalize_gen_kwargs, postprocess_generated_text
        kw = dict(normalize_gen_kwargs(dict(gen_kwargs or {}), self.max_gen_toks))
        until, new = kw.pop("until") or [], kw.pop("max_gen_toks")
        temperature, top_k = sampling_of(kw)
        room = room_for_context(new, self.max_length)
        prompts = [self.tok_encode(c)[-room:] for c in contexts]
        rows = self._decode_until(prompts, new, until, temperature, top_k)
        return [postprocess_generated_text(self.tok_decode(r), until, None) for r in rows]

    def _decode_until(self, prompts, new, until, temperature, top_k):
        """Up to `new` tokens per left-padded prompt, in chunks of 16, 32, ... tokens until every
        row has ended (EOS or an `until` string in its text). Each row's tokens before its EOS."""
        longest = max(len(p) for p in prompts)
        idx = torch.zeros(len(prompts), longest, dtype=torch.long)
        mask = torch.zeros(len(prompts), longest, dtype=torch.bool)
        for i, p in enumerate(prompts):
            idx[i, longest - len(p):], mask[i, longest - len(p):] = torch.tensor(p), True
        idx, mask, eos = idx.to(self._device), mask.to(self._device), self.eot_token_id
        rows, chunk = [[] for _ in prompts], FIRST_CHUNK
        while len(rows[0]) < new:
            n = min(chunk, new - len(rows[0]))
            out = self.model.generate(idx, n, temperature=temperature, top_k=top_k, prompt_mask=mask,
                                      generator=self.generator, stop_token=eos)
            fresh = out[:, idx.shape[1]:]
            for row, toks in zip(rows, fresh.tolist()):
                row.extend(toks + [eos] * (n - len(toks)))  # all rows ended early: the rest is EOS
            if all(eos in r or any(s and s in self.tok_decode(r) for s in until) for r in rows):
                break
            idx = torch.cat([idx, fresh], 1)
            mask = torch.cat([mask, torch.ones_like(fresh, dtype=torch.bool)], 1)
            chunk *= 2
        return [r[:r.index(eos)] if eos in r else r for r in rows]


def sampling_of(kw):
    """(temperature, top_k) of normalized generation kwargs; 0 = greedy. Settings that
    model.generate has no counterpart for are refused rather than ignored."""
    unknown = sorted(k for k in kw if k not in SAMPLING_KWARGS and not (k == "top_p" and kw[k] in (None, 1, 1.0)))
    if unknown:
        raise UserError(f"generation_kwargs {unknown[0]}={kw[unknown[0]]!r} is not supported by eval_harness.py "
                        f"(it supports {', '.join(SAMPLING_KWARGS)})")
    temperature = float(kw.get("temperature") or 0.0) if kw.get("do_sample") else 0.0
    top_k = kw.get("top_k") or None
    return temperature, (int(top_k) if top_k else None)


def harness_lm(model, tokenizer, batch_size=8, seed=1234):
    """The adapter as an lm_eval LM: HarnessAdapter in front of lm_eval's TemplateLM."""
    require_lm_eval()
    from lm_eval.api.model import TemplateLM
    cls = type("TinyLabLM", (HarnessAdapter, TemplateLM), {"__doc__": HarnessAdapter.__doc__})
    return cls(model, tokenizer, batch_size=batch_size, seed=seed)


_FULL_MANAGERS = {}  # (include_path, its YAML files' stamps) -> TaskManager over lm-eval's tasks too


def task_manager(include_path: str = "", names=()):
    """The harness's tasks plus the YAML tasks under `include_path`. Reading the index of every
    task lm-eval ships takes seconds, so: when each of `names` is a task (or a group of tasks)
    found under `include_path`, only that folder is indexed (the full index would give the same
    tasks: a name in `include_path` replaces lm-eval's of that name); otherwise the full index is
    built once per process and folder contents, and reused."""
    require_lm_eval()
    from lm_eval.tasks import TaskManager
    if include_path and names:
        local = TaskManager(include_path=include_path, include_defaults=False)
        if all(_resolves_within(local.task_index, name) for name in names):
            return local
    key = (include_path or "", _yaml_stamps(include_path))
    if key not in _FULL_MANAGERS:
        _FULL_MANAGERS[key] = TaskManager(include_path=include_path or None)
    return _FULL_MANAGERS[key]


def _resolves_within(index, name, seen=()) -> bool:
    """`name` (not a glob: one could also match lm-eval's tasks) and everything it builds from are
    entries of `index`, so an index that also holds lm-eval's tasks builds the same thing."""
    from lm_eval.tasks._index import Kind
    entry = index.get(name) if isinstance(name, str) and not any(c in name for c in "*?[") else None
    if entry is None or name in seen:
        return entry is not None
    if entry.kind == Kind.TAG:
        return all(child in index for child in entry.tags)
    if entry.kind != Kind.GROUP:
        return True
    members = (entry.cfg or {}).get("task")
    members = members if isinstance(members, list) else [members]
    return all(_resolves_within(index, m.get("group", m.get("task")) if isinstance(m, dict) else m, (*seen, name))
               for m in members)


def _yaml_stamps(folder):
    """(path, size, mtime) of each task YAML under `folder`: a changed folder is indexed again."""
    if not folder:
        return ()
    from pathlib import Path
    return tuple(sorted((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in Path(folder).glob("**/*.yaml")))


def check_tasks(manager, names):
    """Every name is a task, group or tag the manager knows (or a glob matching one), else one line."""
    import difflib
    for name in names:
        if not manager.match_tasks([name]):
            close = difflib.get_close_matches(name, manager.all_tasks, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else " (pass --include_path=DIR for your own task YAMLs)"
            raise UserError(f"--tasks: unknown task '{name}'{hint}")
    return manager.match_tasks(list(names))


def load_tasks(manager, names):
    """(the tasks and groups `names` asked for, every task by name), built once: their datasets
    are read here (without datasets' progress bars), so their settings can be checked before the run."""
    import datasets
    bars = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        loaded = manager.load(list(names))
    finally:
        if bars:
            datasets.enable_progress_bars()
    children = {c for kids in loaded["group_map"].values() for c in kids}
    top = [g for n, g in loaded["groups"].items() if n not in children]
    top += [t for n, t in loaded["tasks"].items() if n not in children]
    return top, loaded["tasks"]


def check_generation_settings(tasks, max_length, max_gen_toks=MAX_GEN_TOKS):
    """Every generate_until task's generation_kwargs are ones the adapter follows, and leave room
    for a context in the window: checked before the run, so a refusal comes before any work."""
    from lm_eval.models.utils import normalize_gen_kwargs
    for name, task in tasks.items():
        if task.get_config("output_type") != "generate_until":
            continue
        kw = dict(normalize_gen_kwargs(dict(task.get_config("generation_kwargs") or {}), max_gen_toks))
        kw.pop("until", None)
        new = kw.pop("max_gen_toks")
        try:
            sampling_of(kw)
            room_for_context(new, max_length)
        except UserError as e:
            raise UserError(f"task {name}: {e}") from None


def room_for_context(max_gen_toks, max_length) -> int:
    """The context tokens a generation keeps: the window less the new tokens."""
    if max_gen_toks >= max_length:
        raise UserError(f"max_gen_toks={max_gen_toks} new tokens leave no room for a context in the model's "
                        f"window (max_seq_len={max_length})")
    return max_length - max_gen_toks


def evaluate(lm, manager, tasks, num_fewshot=None, limit=None, seed=1234, bootstrap_iters=100000,
             log_samples=False):
    """simple_evaluate's results (the dict `lm_eval --output_path` writes, `samples` only with
    log_samples). `tasks`: names, or load_tasks' tasks and groups. `seed` is every seed of the
    harness's (as lm_eval --seed N)."""
    lm_eval = require_lm_eval()
    return lm_eval.simple_evaluate(model=lm, tasks=list(tasks), num_fewshot=num_fewshot, limit=limit,
                                   task_manager=manager, random_seed=seed, numpy_random_seed=seed,
                                   torch_random_seed=seed, fewshot_random_seed=seed,
                                   bootstrap_iters=bootstrap_iters, log_samples=log_samples)


def results_table(results) -> str:
    require_lm_eval()
    from lm_eval.utils import make_table
    table = make_table(results)
    if results.get("groups"):
        table += "\n" + make_table(results, "groups")
    return table
