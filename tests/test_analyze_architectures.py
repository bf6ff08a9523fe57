"""`analyze` on architectures built here (no downloads): a pre-norm ViT with nn.MultiheadAttention and cls and
position tokens, a timm-style attention with one fused qkv Linear, a BatchNorm ResNet, a depthwise-separable
block. Each checked against numpy computations written independently of the package."""

from collections.abc import Callable
from typing import TypeVar

import numpy as np
import pytest
import torch
from torch import nn

import featurelab as fl

M = TypeVar("M", bound=nn.Module)


def submodule(model: nn.Module, path: str, kind: type[M]) -> M:
    """`model`'s submodule at the dotted `path`, checked to be a `kind` (so its attributes are typed)."""
    m = model.get_submodule(path)
    assert isinstance(m, kind), f"{path} is a {type(m).__name__}, not a {kind.__name__}"
    return m


class MHABlock(nn.Module):
    """A pre-norm transformer block: x + attn(LN(x)), then x + MLP(LN(x))."""

    def __init__(self, d, heads):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class TimmAttention(nn.Module):
    """timm's layout: one qkv Linear (rows Q, K, V, heads contiguous), num_heads, proj."""

    def __init__(self, dim, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        att = (q @ k.transpose(-2, -1) * (C // self.num_heads) ** -0.5).softmax(-1)
        return self.proj((att @ v).transpose(1, 2).reshape(B, N, C))


class TimmBlock(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = TimmAttention(d, heads)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.ReLU(), nn.Linear(2 * d, d))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    def __init__(self, block: Callable[[int, int], nn.Module] = MHABlock, d=12, heads=3, depth=2, patch=4):
        super().__init__()
        torch.manual_seed(0)
        self.patch = nn.Conv2d(1, d, patch, stride=patch)
        self.cls_token = nn.Parameter(torch.randn(1, 1, d))
        self.pos_embed = nn.Parameter(torch.randn(1, (8 // patch) ** 2 + 1, d))
        self.blocks = nn.Sequential(*[block(d, heads) for _ in range(depth)])
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, 10)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        return self.head(self.norm(self.blocks(x))[:, 0])


class BasicBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(x + self.bn2(self.conv2(out)))


class BNResNet(nn.Module):
    def __init__(self, c=6):
        super().__init__()
        self.stem, self.bn = nn.Conv2d(1, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.layer1 = nn.Sequential(BasicBlock(c), BasicBlock(c))
        self.pool, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(c, 10)

    def forward(self, x):
        x = torch.relu(self.bn(self.stem(x)))
        return self.fc(torch.flatten(self.pool(self.layer1(x)), 1))


def randomize_norms(model):
    """Non-trivial running statistics and affine parameters, as after training."""
    g = torch.Generator().manual_seed(3)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g))
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.weight.data.copy_(torch.randn(m.num_features, generator=g))
            m.bias.data.copy_(torch.randn(m.num_features, generator=g))
    return model


@pytest.fixture(scope="module")
def images():
    return fl.digits(120).X_train.float().reshape(-1, 1, 8, 8)


def ranks(M: np.ndarray) -> dict:
    s = np.linalg.svd(M, compute_uv=False)
    p = s / s.sum()
    return {
        "sv1": s[0],
        "stable_rank": (s**2).sum() / s[0] ** 2,
        "entropy_rank": float(np.exp(-(p * np.log(p)).sum())),
        "numerical_rank": int((s > 1e-3 * s[0]).sum()),
    }


def check(row, M: np.ndarray, prefix: str = ""):
    for key, value in ranks(M).items():
        assert row[prefix + key] == pytest.approx(value, rel=1e-9), prefix + key


def top_left(M):
    return np.linalg.svd(M)[0][:, 0]


def numpy_attention(x, Wq, Wk, Wv, bq, bk, bv, Wo, bo, heads):
    """Multi-head self-attention on x (T x E) with head h owning rows h·d..(h+1)·d of W_Q, W_K, W_V."""
    d = Wq.shape[0] // heads
    q, k, v = x @ Wq.T + bq, x @ Wk.T + bk, x @ Wv.T + bv
    out = []
    for h in range(heads):
        sl = slice(h * d, (h + 1) * d)
        a = q[:, sl] @ k[:, sl].T / np.sqrt(d)
        a = np.exp(a - a.max(1, keepdims=True))
        out.append((a / a.sum(1, keepdims=True)) @ v[:, sl])
    return np.concatenate(out, 1) @ Wo.T + bo


def per_head(res, name, Wq, Wk, Wv, Wo, heads):
    """The attention table's rows of module `name` against numpy, head by head."""
    d = Wq.shape[0] // heads
    rows = res.attention[res.attention["name"] == name].set_index("head")
    assert list(rows.index) == list(range(heads)) and (rows["d_head"] == d).all()
    for h in range(heads):
        sl = slice(h * d, (h + 1) * d)
        row = rows.loc[h]
        check(row, Wq[sl], "q_")
        check(row, Wk[sl], "k_")
        check(row, Wv[sl], "v_")
        check(row, Wo[:, sl], "o_")
        check(row, Wq[sl].T @ Wk[sl], "qk_")  # scores x W_Qᵀ W_K yᵀ
        check(row, Wv[sl].T @ Wo[:, sl].T, "ov_")  # x W_Vᵀ W_Oᵀ
        assert row["qk_numerical_rank"] <= d


def test_vit_with_multihead_attention(images):
    model = ViT()
    res = fl.analyze(model, images)
    layers = res.layers.set_index("name")
    attn = submodule(model, "blocks.0.attn", nn.MultiheadAttention)
    E = attn.embed_dim
    W = attn.in_proj_weight.detach().double().numpy()
    b = attn.in_proj_bias.detach().double().numpy()
    Wo, bo = attn.out_proj.weight.detach().double().numpy(), attn.out_proj.bias.detach().double().numpy()
    # the split is what the module computes: a numpy attention from the split rows equals its forward
    x = torch.randn(5, E, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    with torch.no_grad():
        ref = attn.double()(x[None], x[None], x[None])[0][0].numpy()
    Wq, Wk, Wv = W[:E], W[E : 2 * E], W[2 * E :]
    mine = numpy_attention(x.numpy(), Wq, Wk, Wv, b[:E], b[E : 2 * E], b[2 * E :], Wo, bo, attn.num_heads)
    np.testing.assert_allclose(mine, ref, atol=1e-12)
    for part, M, bias in (("q", Wq, b[:E]), ("k", Wk, b[E : 2 * E]), ("v", Wv, b[2 * E :])):
        row = layers.loc[f"blocks.0.attn.{part}"]
        assert row["kind"] == f"attention {part}" and row["matrix"] == f"{E}x{E}"
        check(row, M)
        assert row["bias_sq"] == pytest.approx(float((bias**2).sum()), rel=1e-12)
    assert layers.loc["blocks.0.attn.out_proj", "kind"] == "attention out"
    per_head(res, "blocks.0.attn", Wq, Wk, Wv, Wo, attn.num_heads)
    # tokens are typed and read as T x E, never paired
    assert layers.loc["cls_token", "type"] == "token" and layers.loc["pos_embed", "matrix"] == "5x12"
    check(layers.loc["pos_embed"], model.pos_embed.detach().double().numpy()[0])
    assert (res.layers[res.layers["kind"] == "token"]["next"] == "").all()
    # forward order: patch, tokens, then each block's q, k, v, out, mlp; head last
    names = list(res.layers["name"])
    assert names[:3] == ["patch", "cls_token", "pos_embed"] and names[-1] == "head"
    assert names.index("blocks.0.mlp.2") < names.index("blocks.1.attn.q")
    # MLP through GELU: aligned pair, no balance (GELU is not positively homogeneous)
    W1 = submodule(model, "blocks.0.mlp.0", nn.Linear).weight.detach().double().numpy()
    W2 = submodule(model, "blocks.0.mlp.2", nn.Linear).weight.detach().double().numpy()
    row = layers.loc["blocks.0.mlp.0"]
    assert row["next"] == "blocks.0.mlp.2" and np.isnan(row["balance_residual"])
    v1 = np.linalg.svd(W2)[2][0]
    assert row["alignment"] == pytest.approx(abs(top_left(W1) @ v1), abs=1e-10)
    # no pair crosses a residual sum or a LayerNorm
    assert layers.loc["blocks.0.mlp.2", "next"] == "" and layers.loc["patch", "next"] == ""
    norms = res.norms.set_index("name")
    assert norms.loc["blocks.0.norm1", "status"].startswith("normalises across units")
    # default representations: the residual stream
    assert list(res.representations["name"]) == ["input", "blocks.0", "blocks.1", "output"]
    with torch.no_grad():
        m = model.double()
        h = m.patch(images.double()).flatten(2).transpose(1, 2)
        h = m.blocks[0](torch.cat([m.cls_token.expand(len(h), -1, -1), h], 1) + m.pos_embed)
    A = h.reshape(-1, h.shape[-1]).numpy()  # the blocks act on (batch, tokens, width): one row per token
    C = (A - A.mean(0)) / np.sqrt(len(A))
    check(res.representations.set_index("name").loc["blocks.0"], C)


def test_timm_style_fused_qkv(images):
    model = ViT(TimmBlock, d=12, heads=2)
    res = fl.analyze(model, images, representations=["blocks.*.attn", "blocks.1"])
    attn = submodule(model, "blocks.1.attn", TimmAttention)
    E = attn.proj.in_features
    W, b = attn.qkv.weight.detach().double().numpy(), attn.qkv.bias.detach().double().numpy()
    Wo, bo = attn.proj.weight.detach().double().numpy(), attn.proj.bias.detach().double().numpy()
    x = torch.randn(5, E, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    with torch.no_grad():
        ref = attn.double()(x[None])[0].numpy()
    Wq, Wk, Wv = W[:E], W[E : 2 * E], W[2 * E :]
    mine = numpy_attention(x.numpy(), Wq, Wk, Wv, b[:E], b[E : 2 * E], b[2 * E :], Wo, bo, attn.num_heads)
    np.testing.assert_allclose(mine, ref, atol=1e-12)
    layers = res.layers.set_index("name")
    for part, M in (("q", Wq), ("k", Wk), ("v", Wv)):
        check(layers.loc[f"blocks.1.attn.qkv.{part}"], M)
    assert "blocks.1.attn.qkv" not in layers.index and layers.loc["blocks.1.attn.proj", "kind"] == "attention out"
    per_head(res, "blocks.1.attn", Wq, Wk, Wv, Wo, attn.num_heads)
    # a residual MLP block with ReLU: balance and alignment exist
    first = submodule(model, "blocks.1.mlp.0", nn.Linear)
    W1, b1 = first.weight.detach().double().numpy(), first.bias.detach().double()
    W2 = submodule(model, "blocks.1.mlp.2", nn.Linear).weight.detach().double().numpy()
    diff = (W1**2).sum(1) + b1.numpy() ** 2 - (W2**2).sum(0)
    row = layers.loc["blocks.1.mlp.0"]
    assert row["balance_mean"] == pytest.approx(diff.mean(), rel=1e-10)
    assert row["alignment"] == pytest.approx(abs(top_left(W1) @ np.linalg.svd(W2)[2][0]), abs=1e-10)
    assert list(res.representations["name"]) == ["input", "blocks.0.attn", "blocks.1.attn", "blocks.1", "output"]


def folded(conv, bn):
    """Independent BatchNorm folding: W' = diag(γ/√(σ²+ε)) W, b' = (b − μ)·γ/√(σ²+ε) + β."""
    s = (bn.weight.detach().double() / torch.sqrt(bn.running_var.double() + bn.eps)).numpy()
    W = conv.weight.detach().double().numpy() * s[:, None, None, None]
    b = conv.bias.detach().double().numpy() if conv.bias is not None else np.zeros(len(s))
    return W, (b - bn.running_mean.double().numpy()) * s + bn.bias.detach().double().numpy()


def test_batchnorm_resnet_block(images):
    torch.manual_seed(0)
    model = randomize_norms(BNResNet())
    res = fl.analyze(model, images)
    layers = res.layers.set_index("name")
    block = model.layer1[0]
    W1, b1 = folded(block.conv1, block.bn1)
    row = layers.loc["layer1.0.conv1"]
    assert row["folded"] == "layer1.0.bn1" and row["next"] == "layer1.0.conv2"
    check(row, W1.reshape(len(W1), -1))
    assert row["bias_sq"] == pytest.approx(float((b1**2).sum()), rel=1e-12)
    # the pair conv1 -> (bn1 folded) -> ReLU -> conv2: per channel in − out, and the alignment
    W2, _ = folded(block.conv2, block.bn2)
    incoming = (W1**2).sum((1, 2, 3)) + b1**2
    outgoing = (W2**2).sum((0, 2, 3))
    diff = incoming - outgoing
    assert row["balance_mean"] == pytest.approx(diff.mean(), rel=1e-10)
    assert row["balance_residual"] == pytest.approx((np.abs(diff) / (incoming + outgoing)).max(), rel=1e-10)
    side = W2.transpose(0, 2, 3, 1).reshape(-1, W2.shape[1])  # rows: (out, tap), columns: conv1's channels
    v1 = np.linalg.svd(side)[2][0]
    assert row["alignment"] == pytest.approx(abs(top_left(W1.reshape(len(W1), -1)) @ v1), abs=1e-10)
    # conv2 feeds the residual sum: folded, but no pair
    assert layers.loc["layer1.0.conv2", "folded"] == "layer1.0.bn2" and layers.loc["layer1.0.conv2", "next"] == ""
    # the stem's output feeds both conv1 and the skip of layer1.0: no pair; one pair per block
    assert list(res.layers[res.layers["alignment"].notna()]["name"]) == ["layer1.0.conv1", "layer1.1.conv1"]
    assert set(res.norms["status"]) == {f"folded into {n}" for n in ["stem"]} | {
        f"folded into layer1.{i}.conv{j}" for i in (0, 1) for j in (1, 2)
    }
    assert list(res.representations["name"]) == ["input", "layer1.0", "layer1.1", "output"]


def test_depthwise_separable_block(images):
    torch.manual_seed(0)
    c = 4
    model = randomize_norms(
        nn.Sequential(
            nn.Conv2d(1, c, 3, padding=1),
            nn.BatchNorm2d(c),
            nn.ReLU(),
            nn.Conv2d(c, c, 3, padding=1, groups=c),
            nn.BatchNorm2d(c),
            nn.ReLU(),
            nn.Conv2d(c, 8, 1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(8 * 64, 10),
        )
    )
    res = fl.analyze(model, images)
    layers = res.layers.set_index("name")
    Wd, bd = folded(model[3], model[4])
    row = layers.loc["3"]
    assert row["kind"] == "grouped conv" and row["groups"] == c and row["matrix"] == f"{c}x{c * 9}"
    # the block-diagonal operator's singular values are the norms of the c depthwise filters
    norms = np.sort(np.sqrt((Wd**2).sum((1, 2, 3))))[::-1]
    assert row["sv1"] == pytest.approx(norms[0], rel=1e-12)
    assert row["stable_rank"] == pytest.approx((norms**2).sum() / norms[0] ** 2, rel=1e-12)
    # depthwise -> (BN folded) -> ReLU -> pointwise: each channel's filter and bias in, its pointwise column out
    Wp = submodule(model, "6", nn.Conv2d).weight.detach().double().numpy()[:, :, 0, 0]
    diff = (Wd**2).sum((1, 2, 3)) + bd**2 - (Wp**2).sum(0)
    assert row["next"] == "6" and row["balance_mean"] == pytest.approx(diff.mean(), rel=1e-10)
    # the first conv's outputs are read by the depthwise operator: columns of the block-diagonal matrix
    assert layers.loc["0", "next"] == "3" and layers.loc["0", "folded"] == "1"
    # pointwise -> Flatten -> Linear: each channel owns 64 columns of the Linear
    assert layers.loc["6", "next"] == "9" and not np.isnan(layers.loc["6", "balance_residual"])


def test_representation_selector_errors(images):
    with pytest.raises(fl.FeaturelabError, match="matches no module"):
        fl.analyze(ViT(), images, representations=["blocks.9*"])
    with pytest.raises(fl.FeaturelabError, match="not allowed"):
        fl.analyze(ViT(), images, representations=[3])
    with pytest.raises(fl.FeaturelabError, match="without X"):
        fl.analyze(ViT(), representations=["blocks.0"])
    res = fl.analyze(ViT(), images, representations=[nn.GELU])
    assert list(res.representations["name"]) == ["input", "blocks.0.mlp.1", "blocks.1.mlp.1", "output"]


def test_torch_transformer_encoder():
    """nn.TransformerEncoder: its self-attention split per layer, its layers the default representations."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
    model = nn.Sequential(nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), nn.Flatten(), nn.Linear(40, 3))
    X = torch.randn(30, 5, 8)
    res = fl.analyze(model, X)
    assert list(res.representations["name"]) == ["input", "0.layers.0", "0.layers.1", "output"]
    names = list(res.layers["name"])
    assert names[:4] == [f"0.layers.0.self_attn.{p}" for p in ("q", "k", "v", "out_proj")] and names[-1] == "2"
    attn = submodule(model, "0.layers.1.self_attn", nn.MultiheadAttention)
    W = attn.in_proj_weight.detach().double().numpy()
    check(res.layers.set_index("name").loc["0.layers.1.self_attn.v"], W[16:])
    assert len(res.attention) == 4


def test_untraceable_block_keeps_its_sequential_pairs():
    """A block whose forward unpacks x.shape cannot be traced symbolically: it is kept whole, the model still
    traces, and the block's nn.Sequential MLP keeps its pair."""

    class Untraceable(nn.Module):
        def __init__(self):
            super().__init__()
            self.mlp = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 6))

        def forward(self, x):
            B, T, E = x.shape
            return x + self.mlp(x.reshape(B * T, E)).reshape(B, T, E)

    torch.manual_seed(0)
    model = nn.Sequential(Untraceable(), Untraceable(), nn.Flatten(), nn.Linear(24, 2))
    res = fl.analyze(model, torch.randn(20, 4, 6))
    layers = res.layers.set_index("name")
    assert res.summary["layer_order"] == "torch.fx" and layers.loc["1.mlp.0", "next"] == "1.mlp.2"
    assert layers.loc["1.mlp.2", "next"] == "" and list(res.representations["name"]) == ["input", "0", "1", "output"]
