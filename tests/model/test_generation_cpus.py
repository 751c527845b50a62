"""Generation on every CPU torch runs on: bf16, fp32 and fp64 generation in a process limited to
AVX2 (ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2: a CPU without AVX-512) gives the tokens of
the same generation without the limit, and those of the plain no-cache reference decode
(test_model.reference_generate; bf16: every greedy token is the reference's argmax up to bf16
rounding)."""
import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import REPO
from test_model import left_padded, reference_generate, reference_logits, sharp, tiny

AVX2 = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}
NEW = {"long": 50, "short": 20}  # past max_seq_len (40, window refills) / inside it
PROMPTS = {"long": (12, 7, 30), "short": (12, 7)}
pytestmark = pytest.mark.slow  # a child process generates in three dtypes (the module fixture)

# what each side runs: the model from the weights and prompts the test saved, greedy and sampled
# tokens in every dtype. The child process (the AVX2 limit takes effect at a process's start) runs
# it and prints the tokens as JSON; the unlimited side runs it in this process, as it is.
GENERATE_ALL = """
import torch
from model import ModelArgs, Transformer


def generate_all(saved):
    out = {}
    for name in ("float32", "bfloat16", "float64"):
        m = Transformer(ModelArgs(**saved["args"])).eval()
        m.load_state_dict(saved["weights"])
        m.to(getattr(torch, name))
        for case in ("long", "short"):
            idx, mask, new = saved[case]["idx"], saved[case]["mask"], saved[case]["new"]
            greedy = m.generate(idx, new, temperature=0.0, prompt_mask=mask)
            sampled = m.generate(idx, new, temperature=0.8, top_k=10, prompt_mask=mask,
                                 generator=torch.Generator().manual_seed(3))
            out[f"{name}/{case}"] = {"greedy": greedy.tolist(), "sampled": sampled.tolist()}
    return out
"""
CHILD = ("import json, sys\nsys.path.insert(0, sys.argv[2])\n" + GENERATE_ALL
         + "print(json.dumps(generate_all(torch.load(sys.argv[1]))))\n")


def generate_in_child(path, env):
    full = {k: v for k, v in os.environ.items() if k not in AVX2}
    full.update(env)
    done = subprocess.run([sys.executable, "-c", CHILD, str(path), REPO], env=full, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def generate_here(path):
    namespace = {}
    exec(GENERATE_ALL, namespace)
    return namespace["generate_all"](torch.load(path))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The model (fp64 weights), its prompts, and the tokens with AVX2 (a child) and without."""
    m = sharp(tiny(2))
    gen = torch.Generator().manual_seed(7)
    prompts = {case: [torch.randint(0, 67, (n,), generator=gen) for n in PROMPTS[case]] for case in PROMPTS}
    saved = {"args": vars(m.params), "weights": m.state_dict()}
    for case in PROMPTS:
        idx, mask = left_padded(prompts[case])
        saved[case] = {"idx": idx, "mask": mask, "new": NEW[case]}
    path = tmp_path_factory.mktemp("generation") / "model.pt"
    torch.save(saved, path)
    assert not any(k in os.environ for k in AVX2)  # this process runs unlimited
    return m, prompts, generate_in_child(path, AVX2), generate_here(path)


def generated(rows, prompts):
    width = max(len(p) for p in prompts)
    return [row[width:] for row in rows]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_avx2_generation_equals_the_unlimited_one(runs, dtype):
    _, _, avx2, plain = runs
    for case in PROMPTS:
        assert avx2[f"{dtype}/{case}"] == plain[f"{dtype}/{case}"], case


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_avx2_generation_equals_the_reference(runs, dtype):
    """fp32 and fp64: the reference decode in the same dtype, token for token, greedy and sampled
    from the same generator, with the windows restarting past max_seq_len."""
    m, prompts, avx2, _ = runs
    m = m.to(DTYPES[dtype])
    for case in PROMPTS:
        tokens = avx2[f"{dtype}/{case}"]
        assert generated(tokens["greedy"], prompts[case]) == reference_generate(m, prompts[case], NEW[case])
        ref = reference_generate(m, prompts[case], NEW[case], temperature=0.8, top_k=10,
                                 generator=torch.Generator().manual_seed(3))
        assert generated(tokens["sampled"], prompts[case]) == ref


@pytest.mark.slow
def test_avx2_bf16_greedy_tokens_are_the_references_argmax(runs):
    """bf16 rounds every product, so its greedy tokens may leave the fp64 reference's at a near
    tie: inside the window each token's reference logit (fp64 math over the bf16 weights, each
    row alone, no cache) is within bf16 rounding of the reference's largest, far below the spread
    of the logits, and most tokens are the reference's argmax itself."""
    m, prompts, avx2, _ = runs
    m64 = m.to(torch.bfloat16).double()
    rows = avx2["bfloat16/short"]["greedy"]
    width, gaps, spreads = max(len(p) for p in prompts["short"]), [], []
    for p, row in zip(prompts["short"], rows):
        tokens = torch.tensor(row[width - len(p):])
        with torch.no_grad():
            logits = reference_logits(m64, tokens[None])[0, len(p) - 1:-1]  # predicting each new token
        chosen = logits.gather(1, tokens[len(p):, None])[:, 0]
        gaps += (logits.max(1).values - chosen).tolist()
        spreads += (logits.max(1).values - logits.min(1).values).tolist()
    assert max(gaps) <= 0.02 * min(spreads), (max(gaps), min(spreads))
    assert sum(g == 0 for g in gaps) >= 0.9 * len(gaps)
