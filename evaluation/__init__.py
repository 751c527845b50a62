"""Evaluation tools: WikiText perplexity, LAMBADA, feature presence in generations, linear probes."""
