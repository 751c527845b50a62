"""pretok_data: windows, splits, BOS-aligned mode, the global seeded stream, resume state,
DDP equivalence, and the dataset checks train.py relies on."""
import json
import os
import shutil

import numpy as np
import pytest
import torch

from tinylab.core.errors import UserError
from tinylab.data.pretokenized import BatchLoader, check_dataset, dataset_dir, shard_paths

L = 8


def write_shards(folder, sizes):
    """Shard s holds tokens s*1000 + 0..n-1, so a token says where it came from."""
    os.makedirs(folder, exist_ok=True)
    for s, n in enumerate(sizes):
        (s * 1000 + np.arange(n)).astype("<u2").tofile(os.path.join(folder, f"data{s:02d}.bin"))
    return str(folder)


def starts(x):
    """(shard, start offset) of each row of a training batch."""
    return [(int(r[0]) // 1000, int(r[0]) % 1000) for r in x]


def take(loader, n):
    return [next(loader) for _ in range(n)]


def test_training_windows_cover_each_epoch_once(tmp_path):
    d = write_shards(tmp_path, [50, 100, 61, 0, 35])
    loader = BatchLoader(d, "train", batch_size=1, max_seq_len=L, seed=3)
    # n = len // L - 1 windows per shard: 11, 6, (empty shard skipped), 3
    assert loader.windows_per_epoch == 11 + 6 + 3
    epoch = [starts(next(loader)[0])[0] for _ in range(20)]
    assert sorted(epoch) == sorted([(1, i * L) for i in range(11)] + [(2, i * L) for i in range(6)]
                                   + [(4, i * L) for i in range(3)])
    shard_runs = [s for i, (s, _) in enumerate(epoch) if i == 0 or epoch[i - 1][0] != s]
    assert sorted(shard_runs) == [1, 2, 4]  # one shard after the other, in a shuffled order
    epoch2 = [starts(next(loader)[0])[0] for _ in range(20)]
    assert sorted(epoch2) == sorted(epoch) and epoch2 != epoch  # a new permutation each epoch


def test_window_contents_and_types(tmp_path):
    d = write_shards(tmp_path, [40, 100])
    x, y = next(BatchLoader(d, "train", batch_size=4, max_seq_len=L, seed=0))
    assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape == (4, L)
    assert torch.equal(x[:, 1:], y[:, :-1])
    for row_x, row_y in zip(x, y):
        start = int(row_x[0])
        assert row_x.tolist() == list(range(start, start + L)) and int(row_y[-1]) == start + L
        assert (start - 1000) % L == 0 and start + L < 1100


def test_fresh_loader_repeats_and_seed_changes(tmp_path):
    d = write_shards(tmp_path, [40, 300, 300])
    a = take(BatchLoader(d, "train", 4, L, seed=1), 5)
    b = take(BatchLoader(d, "train", 4, L, seed=1), 5)
    c = take(BatchLoader(d, "train", 4, L, seed=2), 5)
    assert all(torch.equal(p[0], q[0]) for p, q in zip(a, b))
    assert not all(torch.equal(p[0], q[0]) for p, q in zip(a, c))


def test_splits(tmp_path):
    d = write_shards(tmp_path, [20] * 11)
    names = lambda paths: [os.path.basename(p) for p in paths]
    assert names(shard_paths(d, "test")) == ["data00.bin"]
    assert names(shard_paths(d, "train")) == [f"data{i:02d}.bin" for i in range(1, 11)]
    assert names(shard_paths(d, "val")) == names(shard_paths(d, "train"))  # any non-test split
    # 80/20: int(0.8 * 10) = 8 pretraining shards, the rest fine-tuning
    assert names(shard_paths(d, "train", split_shards_pretrain=True)) == [f"data{i:02d}.bin" for i in range(1, 9)]
    assert names(shard_paths(d, "train", True, pretraining=False)) == ["data09.bin", "data10.bin"]
    assert names(shard_paths(d, "test", True, pretraining=False)) == ["data00.bin"]
    x, _ = next(BatchLoader(d, "train", 8, 4, seed=0, split_shards_pretrain=True, pretraining=False))
    assert {int(t) // 1000 for t in x[:, 0]} <= {9, 10}


def test_split_without_data_is_a_clear_error(tmp_path):
    d = write_shards(tmp_path / "a", [20, 0, 0])
    with pytest.raises(UserError, match="split 'train'.*no non-empty shard"):
        shard_paths(d, "train")
    with pytest.raises(UserError, match="no .bin shards"):
        shard_paths(str(tmp_path), "train")
    d = write_shards(tmp_path / "b", [20, 20])
    with pytest.raises(UserError, match="too small"):
        BatchLoader(d, "train", 1, 64, seed=0)


def test_bos_aligned_windows(tmp_path):
    bos = 1
    # examples of lengths 5, 12, 3, 4, 3 (each starts with BOS); L = 8 needs 9 tokens from a BOS
    lengths = [5, 12, 3, 4, 3]
    tokens = np.concatenate([[bos] + [100 * (i + 2) + k for k in range(n - 1)] for i, n in enumerate(lengths)])
    os.makedirs(tmp_path / "d")
    for name in ("data00.bin", "data01.bin"):
        tokens.astype("<u2").tofile(tmp_path / "d" / name)
    loader = BatchLoader(str(tmp_path / "d"), "test", 1, L, seed=0, split_on_bos=True)
    bos_pos = np.cumsum([0] + lengths[:-1])  # 0, 5, 17, 20, 24; the last BOS (24) is never a start
    valid = [p for p in bos_pos[:-1] if p + L + 1 <= len(tokens)]  # 0, 5, 17; 20 is too close to the end
    assert valid == [0, 5, 17] and loader.windows_per_epoch == 3
    seen = set()
    for _ in range(3):
        x, y = next(loader)
        assert int(x[0, 0]) == bos and x.shape == (1, L)
        start = bos_pos[int(x[0, 1]) // 100 - 2]  # the token after BOS names the example
        assert x[0].tolist() == tokens[start:start + L].tolist()
        assert y[0].tolist() == tokens[start + 1:start + L + 1].tolist()  # may run into the next example
        seen.add(int(start))
    assert seen == set(valid)


def test_resume_gives_the_uninterrupted_batches(tmp_path):
    d = write_shards(tmp_path, [40, 200, 170, 90])
    full = take(BatchLoader(d, "train", 3, L, seed=5), 40)  # several epochs (47 windows each)
    first = BatchLoader(d, "train", 3, L, seed=5)
    take(first, 17)
    state = json.loads(json.dumps(first.state_dict()))  # JSON-able and small
    assert state["windows_consumed"] == 51 and len(json.dumps(state)) < 200
    resumed = BatchLoader(d, "train", 3, L, seed=5)
    resumed.load_state_dict(state)
    for want, got in zip(full[17:], take(resumed, 23)):
        assert torch.equal(want[0], got[0]) and torch.equal(want[1], got[1])


def test_ddp_ranks_split_the_one_process_stream(tmp_path):
    d = write_shards(tmp_path, [40, 200, 170, 90])
    single = take(BatchLoader(d, "train", 6, L, seed=5), 12)
    ranks = [take(BatchLoader(d, "train", 3, L, seed=5, rank=r, world_size=2), 12) for r in range(2)]
    for step in range(12):
        merged = torch.cat([ranks[0][step][0], ranks[1][step][0]])
        assert torch.equal(merged, single[step][0])
    # resume a 2-process run's state in a 1-process run with the same global batch
    state = BatchLoader(d, "train", 3, L, seed=5, rank=0, world_size=2)
    take(state, 7)
    one = BatchLoader(d, "train", 6, L, seed=5)
    one.load_state_dict(state.state_dict())
    assert torch.equal(next(one)[0], single[7][0])


def test_state_of_another_stream_is_refused(tmp_path):
    d = write_shards(tmp_path, [40, 200])
    state = BatchLoader(d, "train", 2, L, seed=5).state_dict()
    for other in (BatchLoader(d, "train", 2, L, seed=6), BatchLoader(d, "train", 2, L + 1, seed=5),
                  BatchLoader(d, "test", 2, L, seed=5)):
        with pytest.raises(UserError, match="another data stream"):
            other.load_state_dict(state)


# --- check_dataset on a real pretokenized corpus ------------------------------------------------------

def test_check_dataset_ok_and_loader_on_real_data(tiny_corpus):
    m = check_dataset(tiny_corpus.cache_dir, 8192, "pretrain-all")
    assert m["dataset_name"] == "pretrain-all" and m["vocab_size"] == 8192
    assert dataset_dir(tiny_corpus.cache_dir, 8192, "pretrain-all") == tiny_corpus.dataset_dir
    x, y = next(BatchLoader(tiny_corpus.dataset_dir, "test", 4, 64, seed=0, split_on_bos=True))
    assert (x[:, 0] == 1).all()


def test_check_dataset_missing_says_how_to_build(tiny_corpus):
    with pytest.raises(UserError) as e:
        check_dataset(tiny_corpus.cache_dir, 8192, "filter-adv-Twist")
    msg = str(e.value)
    assert "not found: run: python tinystories.py pretokenize --vocab_size=8192" in msg
    assert "--filtering=features!=Twist --adversarial_training=features=Twist:1.0 --dataset_name=filter-adv-Twist" in msg
    with pytest.raises(UserError, match="flags it was built with"):
        check_dataset(tiny_corpus.cache_dir, 8192, "something-else")
    with pytest.raises(UserError, match="tok512"):
        check_dataset(tiny_corpus.cache_dir, 512, "pretrain-all")


def test_check_dataset_mismatch(tiny_corpus, tmp_path):
    cache = str(tmp_path)
    shutil.copytree(tiny_corpus.dataset_dir, os.path.join(cache, "tok8192", "pretrain-all"))
    shutil.copy(tiny_corpus.tokenizer_model, cache)
    check_dataset(cache, 8192, "pretrain-all")
    # another tokenizer file under the same name
    with open(os.path.join(cache, "tok8192.model"), "ab") as f:
        f.write(b"\0")
    with pytest.raises(UserError, match="different tokenizer"):
        check_dataset(cache, 8192, "pretrain-all")
    # a manifest saying another vocabulary size than the folder's
    os.rename(os.path.join(cache, "tok8192"), os.path.join(cache, "tok4096"))
    with pytest.raises(UserError, match="8192 pieces but vocab_size=4096"):
        check_dataset(cache, 4096, "pretrain-all")
    # a truncated shard
    folder = os.path.join(cache, "tok4096", "pretrain-all")
    with open(os.path.join(folder, "data01.bin"), "r+b") as f:
        f.truncate(10)
    m = json.load(open(os.path.join(folder, "manifest.json")))
    m["vocab_size"] = 4096
    json.dump(m, open(os.path.join(folder, "manifest.json"), "w"))
    with pytest.raises(UserError, match="data01.bin is missing or has the wrong size"):
        check_dataset(cache, 4096, "pretrain-all")
