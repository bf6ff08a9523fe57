"""A config's sizes are checked from its numbers alone before anything is written (`featurelab.config.check_sizes`):
the memory of a float64 matrix of its two largest sizes, and of one per layer of a depth, against the machine's;
the work they imply against `FLOP_LIMIT`; each refusal one line naming the fields."""

import pytest
from pydantic import BaseModel

from featurelab.config import FLOP_LIMIT, check_sizes, sizes
from featurelab.errors import FeaturelabError
from featurelab.runs.runner import resolve_config
from featurelab.runtime import machine_memory


class Inner(BaseModel):
    width: int = 7
    seed: int = 123456


class Toy(BaseModel):
    n_train: int = 50
    depth: int = 3
    steps: int = 11
    widths: list[int] = [2, 9, 4]
    log_every: int = 10**9
    inner: Inner = Inner()


def test_sizes_and_repeats_are_read_by_field_name():
    size, repeat = sizes(Toy())
    assert size == {"n_train": 50, "depth": 3, "widths": 9, "inner.width": 7}
    assert repeat == {"steps": 11, "len(widths)": 3}


def test_the_work_limit_is_the_product_of_three_sizes_a_repeat_and_the_list_lengths():
    steps = int(FLOP_LIMIT / (50 * 9 * 7 * 3)) + 1  # just over: 50 x 9 x 7 x steps x 3 entries
    with pytest.raises(FeaturelabError, match=r"n_train=50 x widths=9 x inner.width=7 x steps=\d+ x len\(widths\)=3"):
        check_sizes(Toy(steps=steps), "toy")
    check_sizes(Toy(steps=steps - 2), "toy")


def test_a_depth_needs_a_matrix_per_layer():
    depth = machine_memory() // (8 * 50 * 9) + 1
    with pytest.raises(FeaturelabError, match=rf"depth={depth} layers of 50 x 9 float64 \(n_train, widths\)"):
        check_sizes(Toy(depth=depth), "toy")


@pytest.mark.parametrize(
    "name, overrides, fields",
    [
        ("width-plateau", {"teacher_width": 10**8}, "teacher_width"),
        ("width-plateau", {"teacher_n_train": 10**8}, "teacher_n_train"),
        ("width-plateau", {"teacher_d_in": 10**8}, "teacher_d_in"),
        ("saddle-digits", {"depth": 10**8}, "(depth, batch_size)"),
        ("escape-circle", {"phi_points": 10**12}, "phi_points"),
        ("escape-circle", {"steps": 10**12}, "steps=1000000000000"),
        ("escape-circle", {"restarts": 10**12}, "restarts=1000000000000"),
        ("escape-circle", {"rank_one_widths": [10**8]}, "rank_one_widths"),
        ("escape-circle", {"rank_one_widths": []}, "rank_one_widths"),
    ],
)
def test_oversized_configs_are_one_line_naming_the_field(name, overrides, fields):
    with pytest.raises(FeaturelabError) as exc:
        resolve_config(name, "tiny", overrides)
    assert fields in str(exc.value) and "\n" not in str(exc.value)
