"""What the evaluation tools compute: their shared flags (keys), models, tokenizers and text data
for the tools (common), perplexity, LAMBADA, the feature judge, probes, checkpoint comparison,
logged generation tables (run_tables), train.py's in-loop evaluation (lm_eval), staged-training's
evaluation interfaces (staged_eval, hf_models, token_files, staged_train), and reading runs for
plots (plotting)."""
