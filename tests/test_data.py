"""Data: determinism from seeds, the pooled standardisation of Part 1 §5.1, the digits split of
Part 3 §6, and the local-only MNIST readers."""

import gzip
import struct

import numpy as np
import pytest
import torch

import featurelab as fl
from featurelab.data import read_idx


def test_teacher_is_deterministic_and_pooled_standardised():
    a = fl.data.bottleneck_teacher((6, 2, 5), n_train=300, n_test=200, teacher_seed=3, data_seed=4)
    b = fl.data.bottleneck_teacher((6, 2, 5), n_train=300, n_test=200, teacher_seed=3, data_seed=4)
    c = fl.data.bottleneck_teacher((6, 2, 5), n_train=300, n_test=200, teacher_seed=5, data_seed=4)
    assert torch.equal(a.X_train, b.X_train) and torch.equal(a.Y_test, b.Y_test)
    assert torch.equal(a.X_train, c.X_train) and not torch.allclose(a.Y_train, c.Y_train)  # separate seeds
    assert a.X_train.shape == (300, 6) and a.Y_test.shape == (200, 5)
    Y = torch.cat([a.Y_train, a.Y_test]).numpy()  # statistics pooled over both splits
    np.testing.assert_allclose(Y.mean(0), 0, atol=1e-12)
    np.testing.assert_allclose(Y.std(0), 1, rtol=1e-12)
    assert a.meta["bottleneck_rank"] == 2


def test_digits_split_and_normalisations():
    d = fl.digits()
    assert d.X_train.shape == (1000, 64) and d.X_test.shape == (797, 64) and d.n_classes == 10
    assert d.X_train.max() <= 1.0 and d.X_train.min() >= 0.0
    counts = np.bincount(d.Y_train.numpy(), minlength=10)
    assert counts.min() >= 95 and counts.max() <= 105  # stratified
    full = fl.digits(n_train=None, normalize="standardize")
    assert full.X_train.shape == (1797, 64) and full.X_test.shape[0] == 0
    assert full.meta["mu"] == pytest.approx(0.30526, abs=1e-5) and full.meta["sigma"] == pytest.approx(
        0.37605, abs=1e-5
    )
    assert full.X_train.mean().item() == pytest.approx(0.0, abs=1e-12)


def write_idx(path, array, magic):
    header = struct.pack(">I", magic) + b"".join(struct.pack(">I", n) for n in array.shape)
    data = header + array.astype(np.uint8).tobytes()
    (gzip.open if str(path).endswith(".gz") else open)(path, "wb").write(data)


def test_mnist_reads_local_idx_and_npz(tmp_path):
    rng = np.random.default_rng(0)
    xs = {"train": rng.integers(0, 256, (20, 28, 28)), "t10k": rng.integers(0, 256, (7, 28, 28))}
    ys = {"train": rng.integers(0, 10, 20), "t10k": rng.integers(0, 10, 7)}
    for split in ("train", "t10k"):
        write_idx(tmp_path / f"{split}-images-idx3-ubyte.gz", xs[split], 2051)
        write_idx(tmp_path / f"{split}-labels-idx1-ubyte", ys[split], 2049)
    assert np.array_equal(read_idx(tmp_path / "train-images-idx3-ubyte.gz"), xs["train"])
    m = fl.data.mnist(tmp_path, normalize="unit")
    assert m.X_train.shape == (20, 784) and m.X_test.shape == (7, 784)
    np.testing.assert_allclose(m.X_train.numpy(), xs["train"].reshape(20, -1) / 255.0)
    assert np.array_equal(m.Y_test.numpy(), ys["t10k"])
    np.savez(tmp_path / "m.npz", x_train=xs["train"], y_train=ys["train"], x_test=xs["t10k"], y_test=ys["t10k"])
    z = fl.data.mnist(tmp_path / "m.npz")
    assert z.meta["mu"] == pytest.approx((xs["train"] / 255.0).mean())
    torch.testing.assert_close(z.X_train.mean(), torch.tensor(0.0, dtype=torch.float64), atol=1e-12, rtol=0)


def test_mnist_missing_path_is_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.delenv("FEATURELAB_MNIST", raising=False)
    with pytest.raises(fl.FeaturelabError, match="never downloads") as err:
        fl.data.mnist(tmp_path / "nope")
    assert "\n" not in str(err.value)
    with pytest.raises(fl.FeaturelabError, match="FEATURELAB_MNIST"):
        fl.data.mnist()
    with pytest.raises(fl.FeaturelabError, match="t10k-images"):
        write_idx(tmp_path / "train-images-idx3-ubyte", np.zeros((1, 2, 2)), 2051)
        write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros(1), 2049)
        fl.data.mnist(tmp_path)
