"""TinyStories data: records and procedural transforms (dataset_spec), the built-in corpus
(synth_stories), the data stages download / synthesize / train_vocab / pretokenize
(tinystories_data), tokenizers, and the pretokenized batch loader (pretokenized)."""
