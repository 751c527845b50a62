"""Bad input for tinystories.py pretokenize's --mix_match_pairs and --compat: one `error:` line,
exit 2, nothing written (tests/test_bad_input.py's rules)."""
import os

import pytest
from conftest import run_main
from test_bad_input import assert_error, assert_nothing_lost, snapshot

CASES = [
    (["--mix_match=features=Foreshadowing:Twist", "--mix_match_pairs=all"],
     ("--mix_match_pairs: 'all' is not a choice", "the one value is 'original'")),
    (["--mix_match_pairs=original"], ("--mix_match_pairs=original", "give --mix_match too")),
    (["--compat=original", "--mix_match_pairs=original"], ("give --mix_match too",)),
    (["--compat=originals"], ("--compat", "invalid choice: 'originals'")),
    # the flags are still checked first: a bad mix_match is named, not the compat rule
    (["--compat=original", "--mix_match=features=Foreshadowing"], ("--mix_match", "needs KEY:FROM=TO pairs")),
]


@pytest.mark.parametrize("flags, fragments", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_pretokenize_flags(lab_corpus, tmp_path, flags, fragments):
    cache = str(tmp_path / "cache")
    os.makedirs(cache)
    for name in ("TinyStories_all_data", "tok1024.model"):
        os.symlink(os.path.join(lab_corpus.cache_dir, name), os.path.join(cache, name))
    before = snapshot(tmp_path, lab_corpus.cache_dir)
    proc = run_main("tinystories.py", ["pretokenize", f"--data_cache_dir={cache}", "--vocab_size=1024", "--workers=1",
                                       *flags], cwd=str(tmp_path))
    assert_error(proc, 2, *fragments)
    assert_nothing_lost(before, snapshot(tmp_path, lab_corpus.cache_dir), nothing_new=True)


def test_compat_belongs_to_pretokenize(tmp_path):
    before = snapshot(tmp_path)
    proc = run_main("tinystories.py", ["download", f"--data_cache_dir={tmp_path / 'cache'}", "--compat=original"])
    assert_error(proc, 2, "--compat does not apply to download")
    assert_nothing_lost(before, snapshot(tmp_path), nothing_new=True)


def test_a_later_error_is_still_one_line(lab_corpus, tmp_path):
    """compat's notice comes once the dataset is built: a refusal after the flags (here: no
    tokenizer in the cache) is the one line on stderr."""
    cache = str(tmp_path / "cache")
    os.makedirs(cache)
    os.symlink(os.path.join(lab_corpus.cache_dir, "TinyStories_all_data"), os.path.join(cache, "TinyStories_all_data"))
    before = snapshot(tmp_path)
    proc = run_main("tinystories.py", ["pretokenize", f"--data_cache_dir={cache}", "--vocab_size=1024", "--workers=1",
                                       "--compat=original", "--mix_match=features=Foreshadowing:Twist"])
    assert_error(proc, 2, "tok1024")
    assert_nothing_lost(before, snapshot(tmp_path), nothing_new=True)
