"""`analyze` of a weights file: its size and the cost of its spectra are read from the safetensors header
before any tensor is loaded (a 2 GiB matrix is refused in one line, nothing written), and the sha256 a
featurelab file carries in its metadata is checked."""

import json
import struct

import torch
from safetensors.torch import save_file

from featurelab.analysis.loaders import header_sizes
from featurelab.cli import main
from featurelab.training.checkpoint import save_tensors


def test_header_sizes_are_the_bytes_and_the_svd_cost_of_each_matrix(tmp_path):
    path = tmp_path / "w.safetensors"
    tensors = {"a.weight": torch.zeros(3, 5), "b.weight": torch.zeros(7, 2, 2, dtype=torch.float64), "c": torch.ones(4)}
    save_file(tensors, str(path))
    end, cost = header_sizes(path, "weights file")
    assert end == sum(t.numel() * t.element_size() for t in tensors.values())
    assert cost == {"a.weight": 3 * 5 * 3, "b.weight": 7 * 4 * 4}


def test_a_huge_matrix_is_refused_from_the_header_alone(tmp_path, capsys):
    path, out = tmp_path / "big.safetensors", tmp_path / "analysis"
    m, n = 16384, 32768
    header = json.dumps({"w.weight": {"dtype": "F32", "shape": [m, n], "data_offsets": [0, 4 * m * n]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header)  # the 2 GiB of data are never read
    assert main(["analyze", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'w.weight'" in err[0] and f"{float(m * m * n):.3g}" in err[0], err
    assert not out.exists()


def test_a_changed_featurelab_file_fails_its_own_checksum(tmp_path, capsys):
    path, out = tmp_path / "model.safetensors", tmp_path / "analysis"
    save_tensors(path, {"0.weight": torch.randn(4, 3, dtype=torch.float64)})
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01  # a bit of the last weight's mantissa
    path.write_bytes(bytes(data))
    assert main(["analyze", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fails the sha256 in its metadata" in err[0], err
    assert not out.exists()
