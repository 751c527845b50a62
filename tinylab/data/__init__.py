"""TinyStories data, one concern per module:

    records.py        raw records and shards, where datasets live, the per-shard RNG
    template.py       the training text of one example, and the helpers that read it back
    transforms/       the data transforms (one module each; the TRANSFORMS registry)
    dataset_spec.py   a dataset variant: its parsed transforms, applied in order, and its name
    synth_stories.py  the built-in procedural corpus
    download.py, synthesize.py, vocab.py, pretokenize.py   the stages of `tinystories.py`
    workers.py        their worker pool
    tokenizer.py      sentencepiece tokenizers and where they live
    pretokenized.py   the batch loader of a pretokenized dataset (train.py)
    options.py        the config keys of language-modelling data, typed
"""
