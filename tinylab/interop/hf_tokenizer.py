"""A sentencepiece BPE model as a Hugging Face `tokenizer.json` (the `tokenizers` library's format),
so that `AutoTokenizer.from_pretrained(folder)` gives exactly sentencepiece's ids (with BOS).

What sentencepiece does, and the `tokenizers` component that does the same:
- normalization: the model's `normalizer_spec` (read from the file, never assumed). `identity`
  (our tokenizers, Llama 2's) maps nothing; `nmt_nfkc` is its precompiled character map
  (`Precompiled`). Then remove_extra_whitespaces drops leading / trailing spaces and squeezes
  runs (Replace with \\A / \\z: onig's ^ and $ are line anchors), add_dummy_prefix prepends "▁",
  escape_whitespaces turns " " into "▁"; then the trailing "▁"s go, a "▁" of the text's own too
  (sentencepiece strips them after escaping: "a▁" encodes as "▁a"). Only " " is whitespace.
- the model: BPE over the whole normalized text (no pre-tokenizer), merging the adjacent pair
  whose merged piece scores highest; as ranked merges, every split of a normal piece into two
  normal pieces, ordered by the merged piece's score. Unknown characters become <0xXX> byte
  pieces (byte_fallback) or one <unk> per run (fuse_unk).
- BOS in front of every text (TemplateProcessing); decoding as sentencepiece decodes (_decoder).
  BOS / EOS / UNK are special tokens that a text's own "<s>" never matches (split_special_tokens),
  as in sentencepiece.
Anything else (unigram / char / word models, other normalization rules, user-defined symbols,
whitespace as suffix or unescaped) is refused with one line rather than converted approximately.
One difference remains, in decoding only: a run of byte pieces that is not valid UTF-8 becomes
one U+FFFD per byte of the run here, per invalid byte in sentencepiece (which keeps the valid
characters of the run).
"""
import json
import os

from tinylab.core.errors import UserError, first_line

SPM_NORMAL, SPM_USER_DEFINED = 1, 4  # ModelProto.SentencePiece.Type
SPM_BPE = 2  # TrainerSpec.ModelType
CONVERTED_RULES = ("identity", "nmt_nfkc")  # normalization rules converted (and tested) exactly
# transformers 5 loads tokenizer.json as written for this class (an alias of TokenizersBackend);
# LlamaTokenizer would rebuild the pipeline itself (Metaspace, no whitespace normalization)
TOKENIZER_CLASS = "PreTrainedTokenizerFast"
HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def read_model_proto(path):
    """The sentencepiece ModelProto of `path`, or a one-line error."""
    from sentencepiece import sentencepiece_model_pb2 as pb
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise UserError(f"cannot read tokenizer model {path} ({first_line(e, 120)})")
    m = pb.ModelProto()
    try:
        m.ParseFromString(data)
    except Exception as e:  # protobuf's DecodeError, and whatever arbitrary bytes provoke
        raise UserError(f"{path} is not a sentencepiece model ({first_line(e, 120)})")
    if not m.pieces:
        raise UserError(f"{path} is not a sentencepiece model (no pieces)")
    return m


def unconvertible(m):
    """Why the model cannot be converted exactly, or None."""
    ts, ns = m.trainer_spec, m.normalizer_spec
    if ts.model_type != SPM_BPE:
        kind = {1: "unigram", 3: "word", 4: "char"}.get(ts.model_type, str(ts.model_type))
        return f"it is a {kind} model (only BPE models are converted)"
    rule = ns.name or "nmt_nfkc"  # sentencepiece's default
    if rule not in CONVERTED_RULES or (rule == "identity" and ns.precompiled_charsmap):
        return f"its normalization rule is {rule!r} (converted: {', '.join(CONVERTED_RULES)})"
    if m.denormalizer_spec.precompiled_charsmap:
        return "it has a denormalization rule"
    if not ns.escape_whitespaces:
        return "it does not escape whitespace"
    if ts.treat_whitespace_as_suffix:
        return "it treats whitespace as a suffix"
    if any(p.type == SPM_USER_DEFINED for p in m.pieces):
        return "it has user-defined symbols"
    for name, i in (("unk", ts.unk_id), ("bos", ts.bos_id), ("eos", ts.eos_id)):
        if not 0 <= i < len(m.pieces):
            return f"it has no {name} piece ({name}_id {i})"
    unk = m.pieces[ts.unk_id].piece
    if any(unk in p.piece for i, p in enumerate(m.pieces) if i != ts.unk_id):  # the decoder replaces it by name
        return f"a piece other than {unk} contains {unk}"
    return None


def bpe_merges(m):
    """Ranked merges: every split of a normal piece into two normal pieces, by the merged piece's
    score (highest first; ties by id, as sentencepiece's own order), then by the parts' ids."""
    normal = {p.piece: i for i, p in enumerate(m.pieces) if p.type == SPM_NORMAL}
    merges = []
    for i in sorted(normal.values(), key=lambda i: (-m.pieces[i].score, i)):
        piece = m.pieces[i].piece
        splits = [(normal[piece[:k]], normal[piece[k:]], piece[:k], piece[k:]) for k in range(1, len(piece))
                  if piece[:k] in normal and piece[k:] in normal]
        merges += [(a, b) for _, _, a, b in sorted(splits)]
    return merges


def _normalizer(ns):
    from tokenizers import Regex, normalizers
    steps = []
    if ns.precompiled_charsmap:
        steps.append(normalizers.Precompiled(ns.precompiled_charsmap))
    if ns.remove_extra_whitespaces:
        steps += [normalizers.Replace(Regex(r"\A +| +\z"), ""), normalizers.Replace(Regex(" {2,}"), " ")]
    if ns.add_dummy_prefix:
        steps.append(normalizers.Prepend("\u2581"))
    steps.append(normalizers.Replace(" ", "\u2581"))  # escape_whitespaces (unconvertible() checked it)
    if ns.remove_extra_whitespaces:  # sentencepiece strips trailing "▁" after escaping: literal ones too
        steps.append(normalizers.Replace(Regex("\u2581+\\z"), ""))
    return normalizers.Sequence(steps)


def _decoder(m):
    """sentencepiece's decoding: "▁" is a space, byte pieces are bytes, <unk> is the trainer's
    unk_surface, control pieces are nothing. At the start it drops a piece's first "▁": with
    add_dummy_prefix from the first piece, with remove_extra_whitespaces from every piece while
    the text is still empty. Keeping only each token's first "▁" as "▁" until the tokens are
    fused turns both rules into one on the fused text: drop its first "▁", or all leading ones."""
    from tokenizers import Regex, decoders
    ns, ts = m.normalizer_spec, m.trainer_spec
    steps = [decoders.Replace(m.pieces[ts.unk_id].piece, ts.unk_surface),  # one token: the piece itself
             decoders.Replace(Regex("(?<!\\A)\u2581"), " "),  # per token: all but a token's first "▁"
             decoders.ByteFallback(), decoders.Fuse()]
    if ns.remove_extra_whitespaces:
        steps.append(decoders.Replace(Regex("\\A\u2581+"), ""))
    elif ns.add_dummy_prefix:
        steps.append(decoders.Replace(Regex("\\A\u2581"), ""))
    return decoders.Sequence(steps + [decoders.Replace("\u2581", " ")])


def convert(m, where):
    """A `tokenizers.Tokenizer` that encodes and decodes exactly as the sentencepiece model `m`."""
    why = unconvertible(m)
    if why:
        raise UserError(f"cannot convert {where} to a Hugging Face tokenizer: {why}")
    try:
        from tokenizers import AddedToken, Tokenizer, processors
        from tokenizers.models import BPE
    except ImportError:
        raise UserError("the HF export's tokenizer.json needs the tokenizers package (pip install tokenizers)")
    ts = m.trainer_spec
    vocab = {p.piece: i for i, p in enumerate(m.pieces)}
    unk, bos, eos = (m.pieces[i].piece for i in (ts.unk_id, ts.bos_id, ts.eos_id))
    tok = Tokenizer(BPE(vocab=vocab, merges=bpe_merges(m), unk_token=unk, byte_fallback=ts.byte_fallback,
                        fuse_unk=True))
    tok.normalizer = _normalizer(m.normalizer_spec)
    tok.pre_tokenizer = None  # sentencepiece merges across the whole text, spaces included
    tok.decoder = _decoder(m)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos}:1 $B:1", special_tokens=[(bos, ts.bos_id)])
    specials = [i for i in (ts.unk_id, ts.bos_id, ts.eos_id, ts.pad_id) if 0 <= i < len(m.pieces)]
    tok.add_special_tokens([AddedToken(m.pieces[i].piece, special=True, normalized=False) for i in specials])
    return tok


def special_tokens(m):
    """{"bos_token": "<s>", ...}: unk, bos, eos, and pad if the model has one."""
    ts = m.trainer_spec
    ids = {"bos_token": ts.bos_id, "eos_token": ts.eos_id, "unk_token": ts.unk_id, "pad_token": ts.pad_id}
    return {k: m.pieces[i].piece for k, i in ids.items() if 0 <= i < len(m.pieces)}


def tokenizer_files(path, model_max_length):
    """{file name: text} of the HF tokenizer files for the sentencepiece model at `path`; every
    check happens here, before the caller writes anything."""
    m = read_model_proto(path)
    tok = convert(m, path)
    special = special_tokens(m)
    config = {
        "tokenizer_class": TOKENIZER_CLASS, **special, "add_bos_token": True, "add_eos_token": False,
        "model_max_length": model_max_length, "clean_up_tokenization_spaces": False,
        # sentencepiece reads "<s>" in a text as the characters, never as BOS: so does this
        "split_special_tokens": True,
    }
    return {
        "tokenizer.json": tok.to_str(pretty=True),
        "tokenizer_config.json": json.dumps(config, indent=2, ensure_ascii=False),
        "special_tokens_map.json": json.dumps(special, indent=2, ensure_ascii=False),
    }


def write_tokenizer_files(files, folder):
    for name, text in files.items():
        with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
            f.write(text)
