"""A model's training-step GEMMs from its Hugging Face config (fp4lab.model_shapes, `fp4lab sim --model`), held to
models transformers builds from the same config: every weight matrix of the model (nn.Linear, GPT-2's Conv1D, the
routers and the fused 3-D expert parameters) must appear in the derived rows with its shape and its count, and the
rows' token counts must be the rows the model's GEMMs see in a forward pass. Then the command line: the bundled
configs give the bundled shape lists and the same simulated step, a shape list written by --shapes-out replays to
the same step, --full-size times a trace's records at their captured step's size, and bad configs are one line.
FP4LAB_BIN names the built command line (ctest sets it)."""
import json
import math
import os
import re
import subprocess
from collections import Counter, defaultdict

import numpy as np
import pytest
from safetensors.numpy import save_file

import fp4lab

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BIN = os.environ.get("FP4LAB_BIN", os.path.join(ROOT, "build", "bin", "fp4lab"))
MODELS = os.path.join(ROOT, "workloads", "models")
SHAPES = os.path.join(ROOT, "workloads", "shapes")
H100 = os.path.join(ROOT, "sim", "configs", "h100-class.cfg")

BATCH, SEQ = 2, 8  # the forward pass the token counts are taken from: 16 tokens

# The HF parameter each derived row stands for. Fused rows (q, k and v; gate and up) sum the outputs of the
# matrices one layer holds under the same row name.
WEIGHT_ROWS = [
    (r"\.self_attn\.[qkv]_proj\.weight$", "linear_qkv"),
    (r"\.self_attn\.o_proj\.weight$", "linear_proj"),
    (r"\.mlp\.(gate|up)_proj\.weight$", "linear_fc1"),
    (r"\.mlp\.down_proj\.weight$", "linear_fc2"),
    (r"\.mlp\.shared_expert\.(gate|up)_proj\.weight$", "shared_expert.linear_fc1"),
    (r"\.mlp\.shared_expert\.down_proj\.weight$", "shared_expert.linear_fc2"),
    (r"\.mlp\.shared_expert_gate\.weight$", "shared_expert_gate"),
    (r"\.mlp\.gate\.weight$", "router"),
    (r"\.mlp\.experts\.gate_up_proj$", "expert.linear_fc1"),
    (r"\.mlp\.experts\.down_proj$", "expert.linear_fc2"),
    (r"^lm_head\.weight$", "lm_head"),
    (r"\.attn\.c_attn\.weight$", "linear_qkv"),
    (r"\.attn\.c_proj\.weight$", "linear_proj"),
    (r"\.mlp\.c_fc\.weight$", "linear_fc1"),
    (r"\.mlp\.c_proj\.weight$", "linear_fc2"),
]


def row_of(name):
    for pattern, row in WEIGHT_ROWS:
        m = re.search(pattern, name)
        if m:
            return row, name[:m.start()]
    return None, None


def model_weights(model):
    """{row: Counter{(in, out): matrices}} of every weight matrix of `model`, fused as the rows fuse them."""
    import torch
    from transformers.pytorch_utils import Conv1D
    fused = defaultdict(list)  # (row, layer prefix) -> [(in, out)]
    for name, p in model.named_parameters(remove_duplicate=False):  # the tied lm_head too
        if p.ndim < 2:
            continue
        owner = model.get_submodule(name.rsplit(".", 1)[0])
        if isinstance(owner, torch.nn.Embedding):
            continue  # a look-up, not a GEMM
        row, prefix = row_of(name)
        assert row, f"weight {name} {tuple(p.shape)} of {type(owner).__name__} is in no derived row"
        if p.ndim == 3:  # [experts, out, in]: F.linear(x, p[e]) per expert
            for _ in range(p.shape[0]):
                fused[(row, f"{prefix}#{_}")].append((p.shape[2], p.shape[1]))
        elif isinstance(owner, Conv1D):  # GPT-2: weight [in, out], x @ W
            fused[(row, prefix)].append((p.shape[0], p.shape[1]))
        else:  # nn.Linear and the routers: weight [out, in], F.linear(x, W)
            fused[(row, prefix)].append((p.shape[1], p.shape[0]))
    out = defaultdict(Counter)
    for (row, _), mats in fused.items():
        ins = {i for i, _ in mats}
        assert len(ins) == 1, (row, mats)  # a fused row's matrices read the same input
        out[row][(ins.pop(), sum(o for _, o in mats))] += 1
    return out


def derived_weights(rows):
    out = defaultdict(Counter)
    for r in rows:
        out[r["gemm"]][(r["in"], r["out"])] += r["count"]
    return out


def forward_rows(model, cfg):
    """{row: {tokens seen by each call}} of a forward pass of BATCH x SEQ tokens, and the experts' (tokens, top_k)."""
    import torch
    from transformers.pytorch_utils import Conv1D
    seen, routed, hooks = defaultdict(set), [], []
    for name, mod in model.named_modules():
        if isinstance(mod, (torch.nn.Linear, Conv1D)):
            row, _ = row_of(name + ".weight")
            if row:
                hooks.append(mod.register_forward_hook(
                    lambda m, args, out, row=row: seen[row].add(args[0].reshape(-1, args[0].shape[-1]).shape[0])))
        elif type(mod).__name__.endswith("Experts"):
            def pre(m, args, kwargs):
                idx = args[1] if len(args) > 1 else kwargs["top_k_index"]
                routed.append(tuple(idx.shape))
            hooks.append(mod.register_forward_pre_hook(pre, with_kwargs=True))
    ids = torch.randint(0, cfg.vocab_size, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model(input_ids=ids)
    for h in hooks:
        h.remove()
    return seen, routed


# (model_type, config.json fields): each built by transformers from these fields, and derived by fp4lab from the
# same fields, absent ones included (the defaults must agree).
SMALL = dict(hidden_size=64, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, vocab_size=100)
CASES = {
    "llama_gqa": ("llama", dict(SMALL, num_key_value_heads=2)),
    "llama_mha_default_kv_head_dim": ("llama", dict(SMALL, head_dim=24)),  # no num_key_value_heads: MHA
    "mistral": ("mistral", dict(SMALL, num_key_value_heads=1, head_dim=None)),
    "mixtral": ("mixtral", dict(SMALL, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)),
    "mixtral_num_experts_alias": ("mixtral", dict(SMALL, num_key_value_heads=2, num_experts=3,
                                                  num_experts_per_tok=2)),
    "qwen2": ("qwen2", dict(SMALL, num_key_value_heads=2)),
    "qwen3": ("qwen3", dict(SMALL, num_key_value_heads=2, head_dim=24)),
    "qwen2_moe_sparse_step_and_mlp_only": ("qwen2_moe", dict(
        SMALL, num_hidden_layers=4, num_key_value_heads=2, num_experts=6, num_experts_per_tok=4,
        moe_intermediate_size=32, shared_expert_intermediate_size=80, decoder_sparse_step=2, mlp_only_layers=[3])),
    "qwen3_moe": ("qwen3_moe", dict(SMALL, num_key_value_heads=2, head_dim=24, num_experts=8, num_experts_per_tok=2,
                                    moe_intermediate_size=32, decoder_sparse_step=1, mlp_only_layers=[0])),
    "gpt2": ("gpt2", dict(n_embd=64, n_layer=2, n_head=4, vocab_size=101, n_inner=None)),
    "gpt2_n_inner": ("gpt2", dict(n_embd=64, n_layer=3, n_head=4, vocab_size=96, n_inner=80, bos_token_id=0,
                                  eos_token_id=0)),
}


@pytest.fixture(scope="module")
def hf():
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    return transformers


@pytest.mark.parametrize("case", sorted(CASES))
def test_rows_are_the_hf_models_weights_and_tokens(hf, case):
    import torch
    model_type, fields = CASES[case]
    cfg = hf.AutoConfig.for_model(model_type, **fields)
    torch.manual_seed(0)
    model = hf.AutoModelForCausalLM.from_config(cfg).eval()
    tokens = BATCH * SEQ
    rows = fp4lab.model_shapes(dict(fields, model_type=model_type), tokens)
    assert fp4lab.model_shapes(cfg, tokens) == rows  # the transformers config object (its to_dict()) too
    assert derived_weights(rows) == model_weights(model)

    seen, routed = forward_rows(model, cfg)
    by_row = {r["gemm"]: r for r in rows}
    for row, calls in seen.items():
        assert calls == {by_row[row]["tokens"]}, (row, calls)
    experts = [r for r in rows if r["gemm"].startswith("expert.")]
    assert bool(experts) == bool(routed)
    for r in experts:  # balanced routing: each expert takes the ceiling of its share of the routed tokens
        n_experts = next(x["out"] for x in rows if x["gemm"] == "router")
        for t, k in routed:
            assert t == tokens and r["tokens"] == math.ceil(t * k / n_experts)


def test_mlp_only_and_sparse_step_pick_the_layers_hf_makes_sparse(hf):
    fields = CASES["qwen2_moe_sparse_step_and_mlp_only"][1]
    cfg = hf.AutoConfig.for_model("qwen2_moe", **fields)
    model = hf.AutoModelForCausalLM.from_config(cfg)
    sparse = sum(hasattr(layer.mlp, "experts") for layer in model.model.layers)
    rows = {r["gemm"]: r for r in fp4lab.model_shapes(dict(fields, model_type="qwen2_moe"), 16)}
    assert sparse == 1 and rows["router"]["count"] == 1 and rows["linear_fc1"]["count"] == 3
    assert rows["expert.linear_fc1"]["count"] == 6 and rows["expert.linear_fc1"]["tokens"] == math.ceil(16 * 4 / 6)


def test_defaults_hf_takes_from_other_numbers_are_refused(hf):
    """Where a config class defaults a field to a number of its own (Mistral's num_key_value_heads 8, Qwen3's
    head_dim 128), fp4lab asks for the field rather than guess the class's number."""
    assert hf.AutoConfig.for_model("mistral", **SMALL).num_key_value_heads == 8
    with pytest.raises(ValueError, match=r"^config: num_key_value_heads: missing"):
        fp4lab.model_shapes(dict(SMALL, model_type="mistral"), 16)
    with pytest.raises(ValueError, match=r"^config: head_dim: missing"):
        fp4lab.model_shapes(dict(SMALL, model_type="qwen3", num_key_value_heads=2), 16)


@pytest.mark.parametrize("fields, fault", [
    ({"model_type": "bert"}, "model_type: 'bert' is not supported"),
    ({}, "model_type: missing"),
    (dict(SMALL, model_type="llama", hidden_size=64.0), "hidden_size: 64.0 is not an integer"),
    (dict(SMALL, model_type="llama", vocab_size=0), "vocab_size: 0 is outside 1..2147483648"),
    (dict(SMALL, model_type="llama", num_key_value_heads=3), "num_key_value_heads: 3 does not divide"),
    (dict(SMALL, model_type="llama", hidden_size=66), "head_dim: missing, and num_attention_heads 4 does not divide"),
    (dict(SMALL, model_type="mixtral", num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=5),
     "num_experts_per_tok: 5 is outside 1..4"),
    (dict(SMALL, model_type="mixtral", num_key_value_heads=2, num_local_experts=4, num_experts=5,
          num_experts_per_tok=2), "num_local_experts: given as 4 and, as num_experts, 5"),
    (dict(SMALL, model_type="qwen3_moe", num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
          moe_intermediate_size=8, mlp_only_layers=[2]), "mlp_only_layers: 2 is outside 0..1"),
    (dict(SMALL, model_type="llama", intermediate_size=2**30 + 1), "2 x FFN width: 2147483650 is over the 2147483648"),
    (dict(SMALL, model_type="mixtral", num_key_value_heads=2, num_hidden_layers=2**30, num_local_experts=4,
          num_experts_per_tok=1), "expert.linear_fc1: occurs 4294967296 times a step"),
])
def test_bad_configs_name_the_field(fields, fault):
    with pytest.raises(ValueError) as e:
        fp4lab.model_shapes(fields, 16)
    assert str(e.value).startswith("config: " + fault) and "\n" not in str(e.value), str(e.value)


def test_limits_are_inclusive():
    rows = fp4lab.model_shapes(dict(SMALL, model_type="llama", num_hidden_layers=2**31, intermediate_size=2**30),
                               2**31)
    assert rows[2] == {"gemm": "linear_fc1", "tokens": 2**31, "in": 64, "out": 2**31, "count": 2**31}


def test_python_arguments_are_checked():
    with pytest.raises(ValueError, match="tokens = 0 is outside"):
        fp4lab.model_shapes(os.path.join(MODELS, "gpt2.json"), 0)
    with pytest.raises(TypeError, match="tokens must be an integer"):
        fp4lab.model_shapes(os.path.join(MODELS, "gpt2.json"), 16.0)
    with pytest.raises(ValueError, match=r"nope\.json: cannot open model config"):
        fp4lab.model_shapes("nope.json", 16)
    with pytest.raises(ValueError, match="not JSON"):
        fp4lab.model_shapes({"model_type": "llama", "x": float("nan")}, 16)
    assert fp4lab.model_shapes({**SMALL, "model_type": "llama", "hidden_size": np.int64(64)}, 16) == \
        fp4lab.model_shapes({**SMALL, "model_type": "llama"}, 16)


# ---- the command line ----------------------------------------------------------------------------------------

def run(*args):
    return subprocess.run([BIN, "sim", *args], capture_output=True, text=True)


def csv_rows(text):
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    assert lines[0] == "gemm,tokens,in,out,count" or lines[0] == "gemm,tokens,in,out", lines[0]
    out = []
    for ln in lines[1:]:
        f = ln.split(",")
        out.append({"gemm": f[0], "tokens": int(f[1]), "in": int(f[2]), "out": int(f[3]),
                    "count": int(f[4]) if len(f) > 4 else 1})
    return out


def one_line_error(r, code, *needles):
    assert r.returncode == code, (r.returncode, r.stderr)
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("fp4lab sim: error: "), r.stderr
    for n in needles:
        assert n in r.stderr, (n, r.stderr)


@pytest.mark.parametrize("model, shape_list", [("llama2-7b", "llama2-7b"), ("llama2-70b", "llama2-70b"),
                                               ("qwen2.5-1.5b", "dense-1.5b"), ("mixtral-8x7b", "moe-mixtral-8x7b")])
def test_bundled_configs_give_the_bundled_shape_lists(model, shape_list):
    r = run("--model", os.path.join(MODELS, model + ".json"), "--tokens", "4096", "--print-shapes", "--recipe", "ufp4")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    got = csv_rows(r.stdout)
    with open(os.path.join(SHAPES, shape_list + ".csv")) as f:
        want = csv_rows(f.read())
    if model.startswith("mixtral"):  # the shape list leaves Mixtral's router (4096 -> 8, padded to 16) out
        assert [x for x in got if x["gemm"] == "router"] == [
            {"gemm": "router", "tokens": 4096, "in": 4096, "out": 16, "count": 32}]
        got = [x for x in got if x["gemm"] != "router"]
    assert got == want
    # Python's rows are the command line's (rounded to ufp4's 16 as the command line rounds them).
    assert fp4lab.model_shapes(os.path.join(MODELS, model + ".json"), 4096, multiple=16) == csv_rows(r.stdout)


PER_TOKEN = ("tokens", "tokens_per_s", "energy_per_token_pj")  # a --model run knows its token count; --shapes not


def without_per_token(total, tokens):
    """A --model run's total less its per-token figures, after checking them against the rest of the total."""
    assert total["tokens"] == tokens
    assert total["energy_per_token_pj"] == total["energy_total_pj"] / tokens
    assert math.isclose(total["tokens_per_s"], tokens / (total["time_us"] * 1e-6), rel_tol=1e-12)
    return {k: v for k, v in total.items() if k not in PER_TOKEN}


def test_model_replays_the_same_step_as_its_shape_list():
    common = ["--config", H100, "--recipe", "e2m1-ref", "--json", "-"]
    m = run("--model", os.path.join(MODELS, "llama2-7b.json"), "--tokens", "4096", *common)
    s = run("--shapes", os.path.join(SHAPES, "llama2-7b.csv"), *common)
    assert m.returncode == 0 and s.returncode == 0, (m.stderr, s.stderr)
    jm, js = json.loads(m.stdout), json.loads(s.stdout)
    assert without_per_token(jm["total"], 4096) == js["total"] and jm["gemms"] == js["gemms"]
    assert jm["config"]["model"].endswith("llama2-7b.json") and jm["config"]["tokens"] == "4096"
    assert "full-size" not in jm["config"] and "full-size" not in js["config"]


def test_shapes_out_is_the_shape_list_the_run_timed(tmp_path):
    csv, a, b = str(tmp_path / "gpt2.csv"), str(tmp_path / "a.json"), str(tmp_path / "b.json")
    r = run("--model", os.path.join(MODELS, "gpt2.json"), "--tokens", "1024", "--config", H100, "--recipe", "mxfp4",
            "--shapes-out", csv, "--json", a)
    assert r.returncode == 0, r.stderr
    with open(csv) as f:
        text = f.read()
    assert "lm_head out 50257 -> 50272" in text  # the vocabulary padded to mxfp4's block of 32
    assert [x["out"] for x in csv_rows(text) if x["gemm"] == "lm_head"] == [50272]
    r = run("--shapes", csv, "--config", H100, "--recipe", "mxfp4", "--json", b)
    assert r.returncode == 0, r.stderr
    with open(a) as fa, open(b) as fb:
        assert without_per_token(json.load(fa)["total"], 1024) == json.load(fb)["total"]
    assert sorted(os.listdir(tmp_path)) == ["a.json", "b.json", "gpt2.csv"]  # no temporary left


def test_full_size_times_records_at_the_captured_steps_size():
    # workloads/doc-lm: d 1024, FFN 2816 (fc1 out 5632), batch 8 x 1024 = 8192 tokens; 256 tokens and at most
    # 256 outputs of each layer kept.
    r = run("--trace", os.path.join(ROOT, "workloads", "doc-lm", "step_001999"), "--full-size", "--print-shapes")
    assert r.returncode == 0, r.stderr
    want = {"qkv": (1024, 3072), "proj": (1024, 1024), "fc1": (1024, 5632), "fc2": (2816, 1024)}
    rows = csv_rows(r.stdout)
    assert len(rows) == 8
    for x in rows:
        assert (x["tokens"], x["in"], x["out"], x["count"]) == (8192, *want[x["gemm"].split(".")[-1]], 1), x


def test_full_size_check_still_checks_the_captured_tensors():
    trace = os.path.join(ROOT, "workloads", "tiny-lm", "step_005000")
    common = ["--trace", trace, "--config", H100, "--recipe", "ufp4", "--check", "--pass", "fwd_y", "--json", "-"]
    full, plain = run(*common, "--full-size"), run(*common)
    assert full.returncode == 0 and plain.returncode == 0, (full.stderr, plain.stderr)
    jf, jp = json.loads(full.stdout), json.loads(plain.stdout)
    assert jf["config"]["full-size"] is True and "full-size" not in jp["config"]
    for f, p in zip(jf["gemms"], jp["gemms"]):
        assert f["M"] == 8192 and p["M"] == 256  # timed at the pass's 8192 tokens; captured 256
        assert f["check"] == p["check"] == {"outputs": 256 * p["N"], "mismatches": 0}
    assert jf["total"]["macs"] == 32 * jp["total"]["macs"] and jf["total"]["time_us"] > jp["total"]["time_us"]


def write_record(folder, meta):
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(0)
    save_file({"l.fwd_x": rng.standard_normal((32, 32), dtype=np.float32),
               "l.fwd_w": rng.standard_normal((32, 32), dtype=np.float32),
               "l.bwd_dy": rng.standard_normal((32, 32), dtype=np.float32)},
              os.path.join(folder, "l.safetensors"), metadata={"fp4lab.trace.version": "1", **meta})
    return folder


@pytest.mark.parametrize("meta, fault", [
    ({}, "metadata 'tokens_in_pass' is missing"),
    ({"tokens_in_pass": "16"}, "metadata 'tokens_in_pass' = '16' is not a whole number from the record's 32"),
    ({"tokens_in_pass": "64", "out_features_kept": "8 of 100, every 12th from 0"},
     "metadata 'out_features_kept' = '8 of 100, every 12th from 0' is neither 'all 32'"),
    ({"tokens_in_pass": "64", "out_features_kept": "all 64"}, "metadata 'out_features_kept' = 'all 64' is neither"),
    ({"tokens_in_pass": "64", "calls_in_step": "0"}, "metadata 'calls_in_step' = '0' is not a positive whole number"),
])
def test_full_size_refuses_missing_or_foreign_metadata(tmp_path, meta, fault):
    trace = write_record(str(tmp_path / "t"), meta)
    one_line_error(run("--trace", trace, "--full-size", "--print-shapes"), 1, "l.safetensors: " + fault)


def test_full_size_reads_what_capture_writes(tmp_path):
    trace = write_record(str(tmp_path / "t"), {"tokens_in_pass": "100", "calls_in_step": "3",
                                               "out_features_kept": "32 of 50, every 2th from 0"})
    r = run("--trace", trace, "--full-size", "--print-shapes", "--recipe", "mxfp4")
    assert r.returncode == 0, r.stderr
    assert csv_rows(r.stdout) == [{"gemm": "l", "tokens": 128, "in": 32, "out": 64, "count": 3}]  # 32-multiples


def test_model_faults_are_one_line(tmp_path):
    bad = tmp_path / "bert.json"
    bad.write_text('{"model_type": "bert", "hidden_size": 768}')
    gpt2 = os.path.join(MODELS, "gpt2.json")
    one_line_error(run("--model", str(bad), "--tokens", "8", "--print-shapes"), 1, str(bad) + ": model_type: 'bert'")
    dup = tmp_path / "dup.json"
    dup.write_text('{"model_type": "gpt2", "model_type": "llama"}')
    one_line_error(run("--model", str(dup), "--tokens", "8", "--print-shapes"), 1, "key 'model_type' is given twice")
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(17 << 20)  # refused by its size, not read
    one_line_error(run("--model", str(big), "--tokens", "8", "--print-shapes"), 1, "over the 16777216 a model config")
    one_line_error(run("--model", gpt2, "--print-shapes"), 2, "--model FILE and --tokens N go together")
    one_line_error(run("--model", gpt2, "--tokens", "0", "--print-shapes"), 2, "--tokens: '0' is not an integer")
    one_line_error(run("--model", gpt2, "--tokens", "8", "--config", H100, "--shapes-out", gpt2), 2,
                   "output is also an input")
    one_line_error(run("--shapes", os.path.join(SHAPES, "llama2-7b.csv"), "--full-size", "--config", H100), 2,
                   "--full-size sizes a trace's records")
    one_line_error(run("--model", gpt2, "--tokens", "8"), 2, "--config CFG is required")


def test_sweep_out_may_not_overwrite_a_runs_model_config(tmp_path):
    model = tmp_path / "m.json"
    with open(os.path.join(MODELS, "gpt2.json")) as f:
        model.write_text(f.read())
    sweep = tmp_path / "s.toml"
    sweep.write_text(f'[defaults]\nconfig = "{H100}"\nmodel = "{model}"\ntokens = 64\n[[grid]]\nrecipe = ["ufp4"]\n')
    r = subprocess.run([BIN, "sim", "--sweep", str(sweep), "--out", str(tmp_path / "m")], capture_output=True,
                       text=True)
    if "no TOML reader" in r.stderr:
        pytest.skip("this build has no TOML reader")
    one_line_error(r, 2, "m.json: output is also an input")
    assert json.loads(model.read_text())["model_type"] == "gpt2"
