"""`analyze` on sequence models and layouts written here in plain torch: a nanoGPT-style decoder (fused
``c_attn``, causal mask, ``F.gelu``), a Hugging Face-style encoder (separate q/k/v projections, grouped-query
key/value heads, head counts on a ``config``), a fused attention whose head count hides under an odd name,
and an MLP with functional activations. Each checked against computations written independently here."""

import math
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import featurelab as fl
from featurelab.cli import main


# ------------------------------------------------------------------------------ nanoGPT-style decoder
class CausalSelfAttention(nn.Module):
    bias: torch.Tensor  # the causal mask (a buffer)

    def __init__(self, config):
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.n_head, self.n_embd = config.n_head, config.n_embd
        T = config.block_size
        self.register_buffer("bias", torch.tril(torch.ones(T, T)).view(1, 1, T, T))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf")).softmax(-1)
        return self.c_proj((att @ v).transpose(1, 2).contiguous().view(B, T, C))


class GPTMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))


class GPTBlock(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(config.n_embd), nn.LayerNorm(config.n_embd)
        self.attn, self.mlp = CausalSelfAttention(config), GPTMLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Transformer(nn.Module):
    """nanoGPT's ``transformer`` ModuleDict (wte, wpe, h, ln_f), as attributes."""

    def __init__(self, config):
        super().__init__()
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.h = nn.ModuleList([GPTBlock(config) for _ in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(config.n_embd)


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.transformer = Transformer(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying

    def forward(self, idx):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


GPT_CONFIG = SimpleNamespace(vocab_size=11, block_size=8, n_embd=32, n_head=4, n_layer=2)


def make_gpt():
    torch.manual_seed(0)
    return GPT(GPT_CONFIG)


# ------------------------------------------------------------------------ Hugging Face-style encoder
class HFAttention(nn.Module):
    """q_proj/k_proj/v_proj/out_proj; the head counts live on the config only; K and V have fewer heads."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        E, H, Hkv = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
        d = E // H
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(E, E), nn.Linear(E, Hkv * d), nn.Linear(E, Hkv * d)
        self.out_proj = nn.Linear(E, E)

    def forward(self, x):
        B, T, E = x.shape
        H, Hkv = self.config.num_attention_heads, self.config.num_key_value_heads
        d = E // H
        q = self.q_proj(x).view(B, T, H, d).transpose(1, 2)
        k = self.k_proj(x).view(B, T, Hkv, d).transpose(1, 2).repeat_interleave(H // Hkv, dim=1)
        v = self.v_proj(x).view(B, T, Hkv, d).transpose(1, 2).repeat_interleave(H // Hkv, dim=1)
        att = (q @ k.transpose(-2, -1) / math.sqrt(d)).softmax(-1)
        return self.out_proj((att @ v).transpose(1, 2).reshape(B, T, E))


class HFLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        E = config.hidden_size
        self.attention, self.norm1 = HFAttention(config), nn.LayerNorm(E)
        self.mlp, self.norm2 = nn.Sequential(nn.Linear(E, 2 * E), nn.GELU(), nn.Linear(2 * E, E)), nn.LayerNorm(E)

    def forward(self, x):
        x = self.norm1(x + self.attention(x))
        return self.norm2(x + self.mlp(x))


class HFEncoder(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.layer = nn.ModuleList([HFLayer(config) for _ in range(config.num_hidden_layers)])
        self.classifier = nn.Linear(config.hidden_size, 3)

    def forward(self, input_ids):
        x = self.word_embeddings(input_ids) + self.position_embeddings.weight[: input_ids.shape[1]]
        for layer in self.layer:
            x = layer(x)
        return self.classifier(x[:, 0])


HF_CONFIG = SimpleNamespace(
    vocab_size=13,
    max_position_embeddings=8,
    hidden_size=24,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_hidden_layers=2,
)


# ------------------------------------------------------------------- fused attention, odd head count
class OddAttention(nn.Module):
    """A fused qkv whose head count is kept as `h`, a name analyze does not read."""

    def __init__(self, E, h):
        super().__init__()
        self.h, self.qkv, self.out = h, nn.Linear(E, 3 * E), nn.Linear(E, E)

    def forward(self, x):
        B, T, E = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.h, E // self.h).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1) / math.sqrt(E // self.h)).softmax(-1)
        return self.out((att @ v).transpose(1, 2).reshape(B, T, E))


class OddBlock(nn.Module):
    def __init__(self, E, h):
        super().__init__()
        self.attn, self.norm = OddAttention(E, h), nn.LayerNorm(E)

    def forward(self, x):
        return x + self.attn(self.norm(x))


class OddModel(nn.Module):
    def __init__(self, E=16, h=4):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(9, E)
        self.blocks = nn.ModuleList([OddBlock(E, h) for _ in range(2)])
        self.head = nn.Linear(E, 9)

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


# ------------------------------------------------------------------ functional activations
class FunctionalMLP(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2, self.fc3 = nn.Linear(6, 16), nn.Linear(16, 12), nn.Linear(12, 3)

    def forward(self, x):
        h = F.relu(self.fc1(x), inplace=True)  # in place: its input is overwritten
        h = torch.tanh(self.fc2(h))
        return self.fc3(h.relu())


# ------------------------------------------------------------------------ reference computations
def np64(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().numpy()


def centred(A: np.ndarray) -> np.ndarray:
    return (A - A.mean(0)) / np.sqrt(len(A))


def hooked(model: nn.Module, X, names: list[str]) -> dict[str, torch.Tensor]:
    """The outputs of the named modules on X, by forward hooks of our own (float64 copy of the model)."""
    model = model.double().eval()
    modules, out = dict(model.named_modules()), {}
    handles = [modules[n].register_forward_hook(lambda m, i, o, n=n: out.setdefault(n, o.detach())) for n in names]
    with torch.no_grad():
        model(X)
    for h in handles:
        h.remove()
    return out


def check_ranks(row, C: np.ndarray):
    """The representation or weight row `row` against numpy's singular values of C."""
    s = np.linalg.svd(C, compute_uv=False)
    assert [row[f"sv{i}"] for i in range(1, 6)] == pytest.approx(s[:5], rel=1e-9, abs=1e-12)
    assert row["stable_rank"] == pytest.approx((s**2).sum() / s[0] ** 2, rel=1e-9)
    assert row["numerical_rank"] == np.linalg.matrix_rank(C, tol=1e-3 * s[0])


def numpy_coi(A: np.ndarray, gamma0: float = 1e-3) -> float:
    """COI_γ(A) = Tr[Aᵀ(K + γI)⁻¹A], K = σ(A)σ(A)ᵀ, σ(A) = [ReLU(A), 1], γ = γ₀‖K‖_op (arXiv 2405.17573 §2.2)."""
    S = np.hstack([np.maximum(A, 0), np.ones((len(A), 1))])
    K = S @ S.T
    gamma = gamma0 * np.linalg.eigvalsh(K)[-1]
    return float(np.trace(A.T @ np.linalg.solve(K + gamma * np.eye(len(A)), A)))


@pytest.fixture(scope="module")
def tokens():
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, GPT_CONFIG.vocab_size, (40, 6), generator=g)


# ------------------------------------------------------------------------------------------ tests
def test_gpt_tokens_per_token_stream_and_heads(tokens):
    model = make_gpt()
    N, T = tokens.shape
    res = fl.analyze(model, tokens, tokens)  # integer ids in, per-token labels
    reps = res.representations.set_index("name")
    assert list(reps.index) == ["embedded", "transformer.h.0", "transformer.h.1", "output"]
    assert (reps["rows"] == N * T).all() and list(reps["units"]) == [32, 32, 32, GPT_CONFIG.vocab_size]
    # the residual stream, one row per token, against our own hooks
    ref = hooked(make_gpt(), tokens, ["transformer.h.0", "transformer.h.1"])
    for name, H in ref.items():
        check_ranks(reps.loc[name], centred(np64(H).reshape(N * T, -1)))
    with torch.no_grad():
        g = make_gpt().double()
        emb = np64(g.transformer.wte(tokens) + g.transformer.wpe(torch.arange(T)))
        logits = g(tokens)
    E = centred(emb.reshape(N * T, -1))  # wte[id] + wpe[t]: rank <= vocabulary + positions − 1 < width
    assert reps.loc["embedded", "numerical_rank"] == np.linalg.matrix_rank(E) < 32
    check_ranks(reps.loc["embedded"], E)
    assert res.summary["train_error"] == pytest.approx(float((logits.argmax(-1) != tokens).double().mean()))
    # embeddings typed; c_attn read as Q, K, V split into n_head heads
    layers = res.layers.set_index("name")
    assert layers.loc["transformer.wte.weight", "kind"] == "embedding"
    attn = cast(GPTBlock, model.transformer.h[1]).attn
    W, b, C = np64(attn.c_attn.weight), np64(attn.c_attn.bias), 32
    for i, part in enumerate("qkv"):
        row = layers.loc[f"transformer.h.1.attn.c_attn.{part}"]
        assert row["kind"] == f"attention {part}" and row["matrix"] == "32x32"
        np.testing.assert_allclose(res.spectra[row.name], np.linalg.svd(W[i * C : (i + 1) * C], compute_uv=False))
        assert row["bias_sq"] == pytest.approx(float((b[i * C : (i + 1) * C] ** 2).sum()))
    assert layers.loc["transformer.h.1.attn.c_proj", "kind"] == "attention out"
    assert "transformer.h.1.attn.c_attn" not in layers.index
    heads = res.attention[res.attention["name"] == "transformer.h.1.attn"].set_index("head")
    d, Wo = C // 4, np64(attn.c_proj.weight)
    assert list(heads.index) == [0, 1, 2, 3] and (heads["d_head"] == d).all()
    for h in range(4):
        Wq, Wk = W[h * d : (h + 1) * d], W[C + h * d : C + (h + 1) * d]
        Wv, Wo_h = W[2 * C + h * d : 2 * C + (h + 1) * d], Wo[:, h * d : (h + 1) * d]
        qk = np.linalg.svd(Wq.T @ Wk, compute_uv=False)
        ov = np.linalg.svd(Wv.T @ Wo_h.T, compute_uv=False)
        assert heads.loc[h, "qk_sv1"] == pytest.approx(qk[0], rel=1e-10)
        assert heads.loc[h, "qk_stable_rank"] == pytest.approx((qk**2).sum() / qk[0] ** 2, rel=1e-9)
        assert heads.loc[h, "qk_numerical_rank"] == np.linalg.matrix_rank(Wq.T @ Wk, tol=1e-3 * qk[0]) == d
        assert heads.loc[h, "ov_sv1"] == pytest.approx(ov[0], rel=1e-10)
        assert heads.loc[h, "v_sv1"] == pytest.approx(np.linalg.svd(Wv, compute_uv=False)[0], rel=1e-10)
    assert len(res.attention) == 8 and not any("attention" in n for n in res.summary["notes"])


def test_gpt_functional_gelu_and_flat_reading(tokens):
    """F.gelu inside the MLP's forward is a representation; per_token=False reads N x T·E as before."""
    model = make_gpt()
    N, T = tokens.shape
    res = fl.analyze(model, tokens, representations=["transformer.h.*.mlp.gelu"], per_token=False)
    reps = res.representations.set_index("name")
    assert list(reps.index) == ["embedded", "transformer.h.0.mlp.gelu", "transformer.h.1.mlp.gelu", "output"]
    assert reps.loc["transformer.h.1.mlp.gelu", "type"] == "gelu()"
    assert (reps["rows"] == N).all() and reps.loc["transformer.h.1.mlp.gelu", "units"] == T * 128
    fc = hooked(make_gpt(), tokens, ["transformer.h.1.mlp.c_fc"])["transformer.h.1.mlp.c_fc"]
    check_ranks(reps.loc["transformer.h.1.mlp.gelu"], centred(np64(F.gelu(fc)).reshape(N, -1)))
    with pytest.raises(fl.FeaturelabError, match="integer ids"):
        fl.analyze(model, tokens, jacobian=2)


class AssertingGPT(GPT):
    def forward(self, idx):
        assert idx.shape[1] <= GPT_CONFIG.block_size  # control flow on a traced value: the model does not trace
        return super().forward(idx)


def test_untraceable_model_keeps_the_pairs_of_its_traced_blocks():
    torch.manual_seed(0)
    model = AssertingGPT(GPT_CONFIG)
    res = fl.analyze(model)
    assert res.summary["layer_order"] == "registration"
    assert any("cannot trace AssertingGPT" in n for n in res.summary["notes"])
    row = res.layers.set_index("name").loc["transformer.h.1.mlp.c_fc"]
    assert row["next"] == "transformer.h.1.mlp.c_proj" and row["via"] == "gelu"
    mlp = cast(GPTBlock, model.transformer.h[1]).mlp
    W1, W2 = np64(mlp.c_fc.weight), np64(mlp.c_proj.weight)
    u1, v1 = np.linalg.svd(W1)[0][:, 0], np.linalg.svd(W2)[2][0]
    assert row["alignment"] == pytest.approx(abs(u1 @ v1), abs=1e-10)
    assert res.layers.set_index("name").loc["transformer.h.0.mlp.c_proj", "next"] == ""  # into the residual sum


def test_hf_encoder_separate_projections_grouped_heads():
    torch.manual_seed(1)
    model = HFEncoder(HF_CONFIG)
    ids = torch.randint(0, HF_CONFIG.vocab_size, (30, 5), generator=torch.Generator().manual_seed(2))
    res = fl.analyze(model, ids.numpy().astype(np.uint16))  # unsigned ids become int64, never floats
    layers = res.layers.set_index("name")
    attn = cast(HFLayer, model.layer[0]).attention
    for part in ("q", "k", "v"):
        assert layers.loc[f"layer.0.attention.{part}_proj", "kind"] == f"attention {part}"
    assert layers.loc["layer.0.attention.out_proj", "kind"] == "attention out"
    assert layers.loc["layer.0.attention.k_proj", "matrix"] == "12x24"
    assert list(res.layers["name"]).count("layer.0.attention.out_proj") == 1
    # 4 query heads of d = 6 share 2 key/value heads: head h reads K, V head h // 2 (repeat_interleave)
    heads = res.attention[res.attention["name"] == "layer.0.attention"].set_index("head")
    Wq, Wk, Wv, Wo = (np64(p.weight) for p in (attn.q_proj, attn.k_proj, attn.v_proj, attn.out_proj))
    assert list(heads.index) == [0, 1, 2, 3] and (heads["d_head"] == 6).all()
    for h in range(4):
        q, k, v = Wq[6 * h : 6 * h + 6], Wk[6 * (h // 2) : 6 * (h // 2) + 6], Wv[6 * (h // 2) : 6 * (h // 2) + 6]
        assert heads.loc[h, "qk_sv1"] == pytest.approx(np.linalg.svd(q.T @ k, compute_uv=False)[0], rel=1e-10)
        ov = v.T @ Wo[:, 6 * h : 6 * h + 6].T
        assert heads.loc[h, "ov_sv1"] == pytest.approx(np.linalg.svd(ov, compute_uv=False)[0], rel=1e-10)
    # the per-token stream of each layer, against our own hooks
    reps = res.representations.set_index("name")
    H = hooked(model, ids, ["layer.1"])["layer.1"]
    check_ranks(reps.loc["layer.1"], centred(np64(H).reshape(30 * 5, -1)))
    assert reps.loc["output", "rows"] == 30 and reps.loc["layer.1", "rows"] == 150


class BertSelfAttention(nn.Module):
    def __init__(self, E, H):
        super().__init__()
        self.num_attention_heads = H
        self.query, self.key, self.value = nn.Linear(E, E), nn.Linear(E, E), nn.Linear(E, E)


class BertSelfOutput(nn.Module):
    def __init__(self, E):
        super().__init__()
        self.dense, self.LayerNorm = nn.Linear(E, E), nn.LayerNorm(E)


class BertAttention(nn.Module):
    """BERT's layout: query/key/value in `self`, the output projection in the sibling `output.dense`."""

    def __init__(self, E=12, H=3):
        super().__init__()
        self.self = BertSelfAttention(E, H)  # BERT's attribute name
        self.output = BertSelfOutput(E)


def test_bert_layout_output_dense_in_a_sibling():
    torch.manual_seed(5)
    model = nn.Sequential(BertAttention(), BertAttention())  # weights only: no forward is needed
    res = fl.analyze(model)
    layers = res.layers.set_index("name")
    assert list(res.layers["name"]).count("1.output.dense") == 1
    assert (
        layers.loc["1.output.dense", "kind"] == "attention out" and layers.loc["1.self.value", "kind"] == "attention v"
    )
    heads = res.attention[res.attention["name"] == "1.self"].set_index("head")
    att = cast(BertAttention, model[1])
    Wv, Wo = np64(att.self.value.weight), np64(att.output.dense.weight)
    ov = np.linalg.svd(Wv[8:12].T @ Wo[:, 8:12].T, compute_uv=False)  # head 2 of d = 4
    assert list(heads.index) == [0, 1, 2] and heads.loc[2, "ov_sv1"] == pytest.approx(ov[0], rel=1e-10)


def test_odd_head_count_is_noted_then_split_by_heads():
    ids = torch.randint(0, 9, (20, 5), generator=torch.Generator().manual_seed(3))
    res = fl.analyze(OddModel(), ids)
    note = "blocks.0.attn looks like attention but has no head count: pass heads={'blocks.0.attn': H}"
    assert note in res.summary["notes"] and len(res.attention) == 0
    assert "blocks.0.attn.qkv" in set(res.layers["name"])  # read as a plain Linear meanwhile
    model = OddModel()
    res = fl.analyze(model, ids, heads={"blocks.*.attn": 4})
    assert len(res.attention) == 8 and not any("looks like attention" in n for n in res.summary["notes"])
    layers = res.layers.set_index("name")
    W = np64(cast(OddBlock, model.blocks[1]).attn.qkv.weight)
    np.testing.assert_allclose(res.spectra["blocks.1.attn.qkv.v"], np.linalg.svd(W[32:], compute_uv=False))
    assert layers.loc["blocks.1.attn.out", "kind"] == "attention out"
    heads = res.attention[res.attention["name"] == "blocks.1.attn"].set_index("head")
    q, k = W[12:16], W[16 + 12 : 16 + 16]  # head 3 of d = 4: rows 12..15 of Q and of K
    assert heads.loc[3, "qk_sv1"] == pytest.approx(np.linalg.svd(q.T @ k, compute_uv=False)[0], rel=1e-10)
    with pytest.raises(fl.FeaturelabError, match=r"heads\['blocks.0.attn'\] = 3 heads do not split"):
        fl.analyze(OddModel(), heads={"blocks.0.attn": 3})
    with pytest.raises(fl.FeaturelabError, match="'head' matches no attention module"):
        fl.analyze(OddModel(), heads={"head": 2})
    with pytest.raises(fl.FeaturelabError, match="heads\\['x'\\] = 0 is not allowed"):
        fl.analyze(OddModel(), heads={"x": 0})


def test_functional_activations_are_representations():
    model = FunctionalMLP()
    X = torch.randn(40, 6, generator=torch.Generator().manual_seed(4))
    res = fl.analyze(model, X)
    reps = res.representations.set_index("name")
    assert list(reps.index) == ["input", "relu", "tanh", "relu_1", "output"]
    assert list(reps["type"][1:4]) == ["relu()", "tanh()", "relu()"]
    Xd = X.double().numpy()
    pre = Xd @ np64(model.fc1.weight).T + np64(model.fc1.bias)
    hidden = np.maximum(pre, 0)
    check_ranks(reps.loc["relu"], centred(hidden))
    # COI_γ of an activation row reads its input, the pre-activation, even when the activation is in place
    assert reps.loc["relu", "coi_gamma"] == pytest.approx(numpy_coi(pre), rel=1e-8)
    t = np.tanh(hidden @ np64(model.fc2.weight).T + np64(model.fc2.bias))
    check_ranks(reps.loc["tanh"], centred(t))
    # the pair fc1 -> fc2 through F.relu is balanced; the forward is unchanged by the taps
    assert res.layers.set_index("name").loc["fc1", "next"] == "fc2"
    with torch.no_grad():
        ref = model.double()(X.double()).numpy()
    assert reps.loc["output", "sv1"] == pytest.approx(np.linalg.svd(centred(ref), compute_uv=False)[0], rel=1e-10)
    only = fl.analyze(model, X, representations=["tanh"])
    assert list(only.representations["name"]) == ["input", "tanh", "output"]


FACTORY = """
from test_analyze_sequence import make_gpt


def gpt():
    return make_gpt()
"""


@pytest.mark.slow
def test_cli_integer_tokens_from_npz(tmp_path, monkeypatch, capsys, tokens):
    """Integer X from an .npz through the command line, with --heads overriding n_head (2 heads of 16)."""
    (tmp_path / "seqnets.py").write_text(FACTORY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # the models above, importable by the factory
    monkeypatch.delitem(sys.modules, "seqnets", raising=False)
    capsys.readouterr()
    assert main(["analyze", "seqnets:gpt", "--heads", "h.*=4:", "--out", "bad"]) == 2
    assert "--heads 'h.*=4:' is not allowed" in capsys.readouterr().err
    np.savez("tokens.npz", X=tokens.numpy().astype(np.int32), Y=tokens.numpy())
    args = ["analyze", "seqnets:gpt", "--data", "tokens.npz", "--out", "gpt", "--heads", "transformer.h.*.attn=2"]
    assert main(args) == 0
    reps = pd.read_csv(tmp_path / "gpt" / "tables" / "representations.csv").set_index("name")
    N, T = tokens.shape
    assert list(reps.index) == ["embedded", "transformer.h.0", "transformer.h.1", "output"]
    assert (reps["rows"] == N * T).all()
    ref = hooked(make_gpt(), tokens, ["transformer.h.1"])["transformer.h.1"]
    s = np.linalg.svd(centred(np64(ref).reshape(N * T, -1)), compute_uv=False)
    assert reps.loc["transformer.h.1", "sv1"] == pytest.approx(s[0], rel=1e-9)
    heads = pd.read_csv(tmp_path / "gpt" / "tables" / "attention.csv")
    assert len(heads) == 4 and (heads["d_head"] == 16).all()
