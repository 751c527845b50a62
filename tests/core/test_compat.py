"""compat=original: the registry of documented differences, the way it fills a config, and the
docs' tables (docs/originals.md lists exactly the registered differences)."""
import os
import re

import pytest
from conftest import REPO

import tinylab.schema  # noqa: F401  (imports every component: the registry is full)
from tinylab.core.compat import DIFFERENCES, FAMILIES, apply_compat, declare_difference
from tinylab.core.config import Key
from tinylab.core.registry import Registry

ROW = re.compile(r"^\|[^|]*\|\s*`(\w+)\s*=\s*([^`]+)`\s*\|")


def doc_rows():
    """{key: (family heading, original value text)} of docs/originals.md's table rows."""
    rows, family = {}, None
    with open(os.path.join(REPO, "docs", "originals.md"), encoding="utf-8") as f:
        for line in f:
            if line.startswith("## "):
                family = line[3:].strip()
            m = ROW.match(line)
            if m:
                assert m.group(1) not in rows, f"docs/originals.md lists {m.group(1)} twice"
                rows[m.group(1)] = (family, m.group(2).strip())
    return rows


def test_every_difference_has_one_row_and_every_row_a_difference():
    rows = doc_rows()
    registered = {d.key: d for d in DIFFERENCES}
    assert sorted(rows) == sorted(registered), (sorted(set(rows) ^ set(registered)))
    headings = {"study": "TinyStories study", "staged": "Staged training", "t0": "T0 finetuning"}
    for key, (family, value) in rows.items():
        d = registered[key]
        assert family.startswith(headings[d.family]), f"{key} is listed under '{family}', not {d.family}'s table"
        assert value == repr(d.original).strip("'"), f"{key}: the table says {value}, the registry {d.original!r}"
        assert d.behaviour and re.search(r"\S+:\d+", d.source), f"{key}: no behaviour or file:line"


def toy_registry(monkeypatch):
    reg = Registry("difference")
    monkeypatch.setattr("tinylab.core.compat.DIFFERENCES", reg)
    a = Key("toy_repeat", False, "")
    b = Key("toy_warmup", "shifted", "", choices=("shifted", "original"))
    declare_difference(a, True, "study", "repeats", "x.py:1")
    declare_difference(b, "original", "study", "warms", "x.py:2")
    declare_difference(Key("toy_t0", 0, ""), 3, "t0", "t0 thing", "y.py:3")
    return {"toy_repeat": False, "toy_warmup": "shifted", "toy_t0": 0, "compat": "fixed"}


def test_original_sets_the_family_keys_the_user_left_alone(monkeypatch, capsys):
    defaults = toy_registry(monkeypatch)
    assert apply_compat(defaults, defaults, "study") == defaults  # fixed: nothing changes
    cfg = dict(defaults, compat="original", toy_warmup="shifted")
    out = apply_compat(cfg, defaults, "study")
    assert out == dict(cfg, toy_repeat=True, toy_warmup="original")  # t0's key untouched
    assert "compat=original (RobertKirk/tinystories-wrappers): toy_repeat=True, toy_warmup='original'" in \
        capsys.readouterr().err
    # a key the user set keeps its value, and the notice says so
    out = apply_compat(dict(cfg, toy_repeat=False, toy_t0=5), dict(defaults, toy_repeat=True), "study")
    assert out["toy_repeat"] is False and out["toy_warmup"] == "original"
    assert "kept as set: toy_repeat=False" in capsys.readouterr().err
    # a key the user set to its default value (named in `given`, the parser's sources) is kept too
    out = apply_compat(cfg, defaults, "study", given={"toy_warmup": "--toy_warmup"})
    assert out["toy_repeat"] is True and out["toy_warmup"] == "shifted"
    assert "kept as set: toy_warmup='shifted'" in capsys.readouterr().err


def test_a_difference_must_name_a_valid_non_default_original(monkeypatch):
    toy_registry(monkeypatch)
    with pytest.raises(ValueError, match="unknown family"):
        declare_difference(Key("k1", 0, ""), 1, "nanogpt", "x", "a.py:1")
    with pytest.raises(ValueError, match="is the default"):
        declare_difference(Key("k2", 0, ""), 0, "study", "x", "a.py:1")
    with pytest.raises(Exception, match="k3"):
        declare_difference(Key("k3", "a", "", choices=("a", "b")), "c", "study", "x", "a.py:1")


def test_families_are_the_three_originals():
    assert set(FAMILIES) == {"study", "staged", "t0"}
