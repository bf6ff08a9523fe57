"""Reference architectures for `analyze`'s benchmark and docs, built here (nothing is downloaded).

`vit`: a pre-norm vision transformer in timm's layout (patch Conv2d, ``cls_token``, ``pos_embed``, blocks of
LayerNorm → attention with one fused ``qkv`` Linear → residual, LayerNorm → GELU MLP → residual, a final
LayerNorm and a Linear head on the cls token). `resnet18`: the 11.7M-parameter ResNet-18 shape (He et al.,
arXiv 1512.03385, Table 1) with BatchNorm after every conv, for weights-only timing.
"""

from __future__ import annotations

import torch
from torch import nn


class Attention(nn.Module):
    """Multi-head self-attention, timm layout: qkv (E -> 3E, rows Q, K, V; heads contiguous) and proj."""

    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, E = x.shape
        q, k, v = self.qkv(x).reshape(B, T, 3, self.num_heads, E // self.num_heads).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1) * (E // self.num_heads) ** -0.5).softmax(-1)
        return self.proj((att @ v).transpose(1, 2).reshape(B, T, E))


class Block(nn.Module):
    def __init__(self, dim: int, num_heads: int, mlp_ratio: int = 4):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, num_heads)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_ratio * dim), nn.GELU(), nn.Linear(mlp_ratio * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    """Images N x channels x side x side -> N x classes."""

    def __init__(self, depth=12, dim=192, num_heads=3, patch=2, side=8, channels=1, classes=10):
        super().__init__()
        self.patch_embed = nn.Conv2d(channels, dim, patch, stride=patch)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, (side // patch) ** 2 + 1, dim) * 0.02)
        self.blocks = nn.Sequential(*[Block(dim, num_heads) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        return self.head(self.norm(self.blocks(x))[:, 0])


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
        self.conv2, self.bn2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.downsample = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
        return self.relu(out + self.downsample(x))


class ResNet18(nn.Module):
    def __init__(self, classes: int = 1000, channels: int = 3):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(channels, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64)
        self.relu, self.maxpool = nn.ReLU(), nn.MaxPool2d(3, 2, 1)
        widths, stages, cin = (64, 128, 256, 512), [], 64
        for i, w in enumerate(widths):
            stages.append(nn.Sequential(BasicBlock(cin, w, 1 if i == 0 else 2), BasicBlock(w, w, 1)))
            cin = w
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(512, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


__all__ = ["ViT", "ResNet18"]
