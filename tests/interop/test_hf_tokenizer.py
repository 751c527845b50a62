"""The HF export's tokenizer (tinylab/interop/hf_tokenizer.py): `AutoTokenizer.from_pretrained`
on the exported folder against sentencepiece itself (the reference), on the shipped tokenizers
and on small models trained here for the other settings the converter accepts."""
import glob
import json
import os
import random

import pytest
import sentencepiece as spm
from conftest import LLAMA2_TOKENIZER, TOK8192, WIKITEXT
from conftest import tiny_model as shared_tiny_model

from tinylab.core.errors import UserError
from tinylab.data.records import load_raw_shard
from tinylab.data.template import make_text
from tinylab.interop import hf, hf_tokenizer

# the corner cases of sentencepiece's whitespace handling, byte fallback and special pieces
EDGE_TEXTS = [
    "", " ", "  ", "\n", "\n\n", "\t", "Hello world", "  two  spaces  inside", "trailing ", " leading",
    "a   b    c", "x  \n  y", "tab\there", "line\nbreak\r\nwindows", "a\u00a0b (no-break space)",
    "\u200bzero width", "\u3000ideographic space", "émoji 🙂👍🏽 and 漢字かなカナ 한국어", "Ünïcödé ß ﬁ ① ｆｕｌｌ",
    "<s> a literal </s> and <unk>", "<0x0A> is text too", "digits 12345 3.14 -7", "\u2581 the meta symbol",
    "Features: Twist\nStory: Once upon a time, there was a little girl named Lily.",
]
ALPHABET = "ab c\n\t .,!?0123456789éü漢🙂\u00a0  xyzXYZ-'\"<>/\u2581"


def varied_texts(stories, n_random=1500, seed=0):
    rng = random.Random(seed)
    with open(WIKITEXT, encoding="utf-8") as f:
        wiki = f.read().split("\n")
    texts = EDGE_TEXTS + stories + wiki[:120] + ["\n".join(wiki[:40])]
    return texts + ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 40))) for _ in range(n_random)]


@pytest.fixture(scope="module")
def stories(tiny_corpus):
    """The built-in TinyStories-schema corpus as training sees it (instruction header + story)."""
    rng = random.Random(0)
    shard = sorted(glob.glob(os.path.join(tiny_corpus.raw_dir, "*.json")))[0]
    return [make_text(r, rng) for r in load_raw_shard(shard)[:150]]


def export_tokenizer_only(model_path, folder):
    files = hf_tokenizer.tokenizer_files(model_path, model_max_length=64)
    os.makedirs(folder)
    hf_tokenizer.write_tokenizer_files(files, folder)
    return str(folder)


def assert_same_as_sentencepiece(folder, model_path, texts):
    """AutoTokenizer's ids equal BOS + sentencepiece's on every text, and decoding gives what
    sentencepiece decodes (with or without the BOS in the ids; skipping special tokens drops
    <unk>, which sentencepiece writes as its unk_surface)."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(folder)
    sp = spm.SentencePieceProcessor(model_file=model_path)
    want = [[sp.bos_id()] + ids for ids in sp.encode(texts)]
    got = tok(texts)["input_ids"]
    bad = [(t, g[:20], w[:20]) for t, g, w in zip(texts, got, want) if g != w]
    assert not bad, f"{len(bad)} of {len(texts)} texts differ, e.g. {bad[:3]}"
    assert tok(texts[:50], add_special_tokens=False)["input_ids"] == [w[1:] for w in want[:50]]
    # and id sequences no text encodes to, which sentencepiece still decodes by its rules (leading
    # whitespace-only pieces, a piece of several "▁" first, unknown and control pieces anywhere)
    rng = random.Random(2)
    pieces = [i for i in range(sp.get_piece_size()) if not sp.is_byte(i)]
    spaces = [i for i in pieces if sp.id_to_piece(i).startswith("\u2581")]
    for ids in want + [[rng.choice(spaces if rng.random() < 0.6 else pieces) for _ in range(rng.randint(1, 6))]
                       for _ in range(1000)]:
        expected = sp.decode(ids)
        assert tok.decode([i for i in ids if not sp.is_control(i)]) == expected, ids
        assert sp.unk_id() in ids or tok.decode(ids, skip_special_tokens=True) == expected, ids
    return tok


@pytest.mark.slow
@pytest.mark.parametrize("model_path", [TOK8192, LLAMA2_TOKENIZER], ids=["tok8192", "llama2"])
def test_autotokenizer_equals_sentencepiece_on_shipped_tokenizers(tmp_path, stories, model_path):
    folder = export_tokenizer_only(model_path, tmp_path / "tok")
    texts = varied_texts(stories)
    tok = assert_same_as_sentencepiece(folder, model_path, texts)
    m = hf_tokenizer.read_model_proto(model_path)
    assert m.normalizer_spec.name == "identity"  # both shipped files: the rule this file was made for
    sp = spm.SentencePieceProcessor(model_file=model_path)
    assert (tok.bos_token_id, tok.eos_token_id, tok.unk_token_id, tok.pad_token) == (sp.bos_id(), sp.eos_id(),
                                                                                      sp.unk_id(), None)
    assert len(tok) == sp.get_piece_size()
    # the settings AutoTokenizer's users rely on, as written
    config = json.loads(open(os.path.join(folder, "tokenizer_config.json")).read())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast" and config["add_bos_token"] is True
    assert json.loads(open(os.path.join(folder, "special_tokens_map.json")).read()) == {
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}


def train_spm(tmp_path, name, stories, **options):
    """A small sentencepiece model trained on the story texts (plus the edge texts' characters)."""
    text = tmp_path / f"{name}.txt"
    text.write_text("\n".join(stories + [t for t in EDGE_TEXTS if t.strip()]), encoding="utf-8")
    settings = dict(model_type="bpe", vocab_size=400, character_coverage=1.0, byte_fallback=True,
                    normalization_rule_name="identity", minloglevel=2, num_threads=1)
    settings.update(options)
    spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(tmp_path / name), **settings)
    return str(tmp_path / f"{name}.model")


@pytest.mark.slow
@pytest.mark.parametrize("name, options", [
    ("nmt_nfkc", dict(normalization_rule_name="nmt_nfkc")),  # sentencepiece's default rule
    ("no_byte_fallback", dict(byte_fallback=False, character_coverage=0.98)),  # unknown characters -> <unk>
    ("no_dummy_prefix", dict(add_dummy_prefix=False, remove_extra_whitespaces=False)),
    ("no_extra_whitespace_removal", dict(remove_extra_whitespaces=False)),  # Llama 2's setting
])
def test_autotokenizer_equals_sentencepiece_on_other_settings(tmp_path, stories, name, options):
    model_path = train_spm(tmp_path, name, stories, **options)
    m = hf_tokenizer.read_model_proto(model_path)
    ns = m.normalizer_spec
    assert ns.name == options.get("normalization_rule_name", "identity")
    assert m.trainer_spec.byte_fallback is options.get("byte_fallback", True)
    assert ns.add_dummy_prefix is options.get("add_dummy_prefix", True)
    folder = export_tokenizer_only(model_path, tmp_path / "tok")
    assert_same_as_sentencepiece(folder, model_path, varied_texts(stories, n_random=600, seed=1))


def test_merges_follow_piece_scores():
    """Every merge forms a normal piece from two normal pieces, in the order of the merged
    pieces' scores, and each normal piece longer than one character is reachable."""
    m = hf_tokenizer.read_model_proto(TOK8192)
    merges = hf_tokenizer.bpe_merges(m)
    score = {p.piece: p.score for p in m.pieces if p.type == 1}
    merged = [score[a + b] for a, b in merges]
    assert all(x >= y for x, y in zip(merged, merged[1:]))
    assert all(a in score and b in score for a, b in merges)
    assert {a + b for a, b in merges} == {p for p in score if len(p) > 1}


def test_export_folder_holds_the_tokenizer_files(tmp_path):
    model = shared_tiny_model(vocab_size=8192, max_seq_len=32)
    out = tmp_path / "hf"
    hf.export_hf(model, str(out), tokenizer=TOK8192, log=lambda *a: None)
    assert sorted(os.listdir(out)) == sorted(hf.HF_FILES)
    assert (out / "tokenizer.model").read_bytes() == open(TOK8192, "rb").read()
    assert json.loads((out / "tokenizer_config.json").read_text())["model_max_length"] == 32
    # an earlier export is replaced as a whole (the files are all ours), a foreign file is not
    hf.export_hf(model, str(out), tokenizer=TOK8192, log=lambda *a: None)
    (out / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="already holds other files"):
        hf.export_hf(model, str(out), tokenizer=TOK8192, log=lambda *a: None)
    assert (out / "notes.txt").read_text() == "mine"


def test_lm_eval_hf_model_reads_the_export(tmp_path):
    """lm-eval's `--model hf` (HFLM) loads the folder and scores continuations as our model does on
    sentencepiece's ids (the reference: log-softmax of our logits, summed over the continuation)."""
    pytest.importorskip("lm_eval")
    import torch
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM
    model = shared_tiny_model(seed=3, vocab_size=8192, max_seq_len=64, tie_embeddings=False).eval()
    hf.export_hf(model, str(tmp_path / "hf"), tokenizer=TOK8192, log=lambda *a: None)
    lm = HFLM(pretrained=str(tmp_path / "hf"), device="cpu", batch_size=2, dtype="float32")
    pairs = [("Once upon a time", " there was a girl."), ("Features: Twist\nStory:", " Lily  liked\tto play. 🙂")]
    got = lm.loglikelihood([Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)])
    sp = spm.SentencePieceProcessor(model_file=TOK8192)
    for (context, continuation), (logprob, _) in zip(pairs, got):
        whole, n_context = [sp.bos_id()] + sp.encode(context + continuation), 1 + len(sp.encode(context))
        with torch.no_grad():
            lp = torch.log_softmax(model(torch.tensor([whole]), all_logits=True)[0].double(), -1)
        want = sum(lp[i - 1, whole[i]].item() for i in range(n_context, len(whole)))
        assert abs(logprob - want) < 1e-4 * abs(want), (context, logprob, want)
