"""Compatibility suite: ``stoker.DataLoader`` must behave like ``torch.utils.data.DataLoader``.

Every test builds the same loader twice, once with torch and once with stoker, from identical
arguments and identical RNG state, and checks that the batches (types, dtypes, shapes and
values, recursively), lengths, warnings and exceptions are the same.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import random
import warnings

import numpy as np
import pytest
import torch
import torch.multiprocessing as torch_mp
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    RandomSampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
    default_collate,
    default_convert,
)

import compat_datasets as cd
import stoker
from support.compare import assert_same

LOADERS = {"torch": DataLoader, "stoker": stoker.DataLoader}
# A loader that deadlocks fails its test instead of hanging the suite (pytest-timeout; 0 lifts
# it: tests/sanitize_extension.sh sets 0, so that a hang under ASan stays a hang for its watch to
# examine, libasan's own fork deadlock included: tests/support/tiers.py).
TEST_TIMEOUT_S = 120
pytestmark = pytest.mark.timeout(TEST_TIMEOUT_S)
TOO_MANY_WORKERS = "ignore:This DataLoader will create"


# --------------------------------------------------------------------------------------------
# Helpers


def collect(loader, epochs=1):
    """All batches of ``epochs`` full passes over ``loader``, as a list of per-epoch lists."""
    return [list(loader) for _ in range(epochs)]


def seed_everything(seed):
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


class Fresh:
    """A loader argument that must be created anew for each loader (generators, samplers)."""

    def __init__(self, make):
        self.make = make

    def __call__(self):
        return self.make()


def gen(seed):
    return Fresh(lambda: torch.Generator().manual_seed(seed))


def make_loader(impl, dataset, **kwargs):
    args = {k: (v() if isinstance(v, Fresh) else v) for k, v in kwargs.items()}
    return LOADERS[impl](dataset, **args)


def run_both(make_dataset, *, epochs=1, seed=0, **kwargs):
    """Build torch's and stoker's loader from the same arguments and RNG state; compare."""
    results = {}
    for impl in LOADERS:
        seed_everything(seed)
        loader = make_loader(impl, make_dataset(), **kwargs)
        results[impl] = collect(loader, epochs)
        # Drop the loader now: a failing assert would otherwise keep (persistent) workers
        # alive through the traceback and slow down every later test.
        del loader
    assert_same(results["torch"], results["stoker"], "epochs")
    return results["torch"]


def flat(epochs):
    return [batch for epoch in epochs for batch in epoch]


# --------------------------------------------------------------------------------------------
# Sanity checks of the helpers themselves


def test_assert_same_detects_differences():
    assert_same({"a": [torch.tensor([float("nan"), 1.0])]}, {"a": [torch.tensor([math.nan, 1.0])]})
    for a, b in [
        (torch.tensor([1, 2]), torch.tensor([1, 3])),
        (torch.tensor([1, 2]), torch.tensor([1, 2], dtype=torch.int32)),
        (torch.tensor([1, 2]), torch.tensor([[1, 2]])),
        (np.array([1.0]), np.array([1.0], dtype=np.float32)),
        ((1, 2), [1, 2]),
        (cd.Point(1, 2), (1, 2)),
        ({"a": 1, "b": 2}, {"b": 2, "a": 1}),
        (1, 1.0),
        (True, 1),
        (np.float32(1), 1.0),
        ("a", b"a"),
        (torch.tensor(1.0, dtype=torch.float8_e4m3fn), torch.tensor(2.0).to(torch.float8_e4m3fn)),
    ]:
        with pytest.raises(AssertionError):
            assert_same(a, b)


# --------------------------------------------------------------------------------------------
# batch_size / drop_last / num_workers / map-style basics


@pytest.mark.parametrize("num_workers", [0, 1, 2])
@pytest.mark.parametrize("batch_size", [1, 4, 5, 23, 30])
@pytest.mark.parametrize("drop_last", [False, True])
def test_map_style_batches(num_workers, batch_size, drop_last):
    out = run_both(
        cd.TensorLabelDataset,
        batch_size=batch_size,
        drop_last=drop_last,
        num_workers=num_workers,
    )
    expected = 23 // batch_size if drop_last else math.ceil(23 / batch_size)
    assert len(out[0]) == expected


@pytest.mark.filterwarnings(TOO_MANY_WORKERS)
def test_three_workers():
    out = run_both(cd.TensorLabelDataset, batch_size=3, num_workers=3)
    assert len(out[0]) == 8


@pytest.mark.parametrize("num_workers", [0, 2])
def test_batch_size_none_disables_auto_collation(num_workers):
    out = run_both(cd.NumpyDtypeDataset, batch_size=None, num_workers=num_workers)
    first = out[0][0]
    assert isinstance(first["arr_int16"], torch.Tensor)  # default_convert: ndarray -> Tensor
    assert first["arr_int16"].shape == (2, 3)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_batch_size_none_keeps_tuples_lists_and_python_scalars(num_workers):
    out = run_both(cd.TensorLabelDataset, batch_size=None, num_workers=num_workers)
    assert len(out[0]) == 23
    assert type(out[0][0]) is list  # default_convert turns tuples into lists
    assert type(out[0][0][1]) is int


def test_default_batch_size_is_one():
    out = run_both(cd.TensorLabelDataset, num_workers=2)
    assert len(out[0]) == 23 and out[0][0][0].shape == (1, 3)


# --------------------------------------------------------------------------------------------
# Shuffling, samplers, generators and RNG consumption


@pytest.mark.parametrize("num_workers", [0, 2])
def test_shuffle_with_seeded_generator(num_workers):
    out = run_both(
        cd.TensorLabelDataset,
        epochs=2,
        batch_size=4,
        shuffle=True,
        num_workers=num_workers,
        generator=gen(1234),
    )
    labels = [torch.cat([b[1] for b in epoch]).tolist() for epoch in out]
    assert sorted(labels[0]) == list(range(23)) and labels[0] != list(range(23))
    assert labels[0] != labels[1]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_shuffle_with_global_manual_seed(num_workers):
    out = run_both(
        cd.TensorLabelDataset,
        epochs=2,
        seed=99,
        batch_size=5,
        shuffle=True,
        num_workers=num_workers,
    )
    assert sorted(torch.cat([b[1] for b in out[1]]).tolist()) == list(range(23))


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("use_generator", [False, True])
def test_global_rng_state_after_epochs_matches(num_workers, use_generator):
    """Loaders draw base_seed (and the sampler's seed) from the global RNG or ``generator``."""
    after = {}
    for impl in LOADERS:
        seed_everything(5)
        loader = make_loader(
            impl,
            cd.TensorLabelDataset(),
            batch_size=4,
            shuffle=True,
            num_workers=num_workers,
            generator=gen(8) if use_generator else None,
        )
        batches = collect(loader, epochs=2)
        after[impl] = (batches, torch.rand(3), random.random(), np.random.rand())
    assert_same(after["torch"], after["stoker"])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_global_rng_draws_between_iter_and_next(num_workers):
    """RNG draws interleaved with iterator creation and the first ``next`` must line up."""
    seen = {}
    for impl in LOADERS:
        seed_everything(17)
        loader = make_loader(
            impl, cd.TensorLabelDataset(), batch_size=6, shuffle=True, num_workers=num_workers
        )
        it = iter(loader)
        between = torch.rand(2)
        batches = list(it)
        seen[impl] = (between, batches, torch.rand(2))
    assert_same(seen["torch"], seen["stoker"])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_subset_random_sampler(num_workers):
    indices = [1, 3, 4, 8, 9, 13, 20, 22]
    out = run_both(
        cd.TensorLabelDataset,
        epochs=2,
        batch_size=3,
        num_workers=num_workers,
        sampler=Fresh(
            lambda: SubsetRandomSampler(indices, generator=torch.Generator().manual_seed(3))
        ),
    )
    assert sorted(torch.cat([b[1] for b in out[0]]).tolist()) == indices


@pytest.mark.parametrize("num_workers", [0, 2])
def test_subset_random_sampler_global_rng(num_workers):
    run_both(
        cd.TensorLabelDataset,
        seed=4,
        batch_size=2,
        num_workers=num_workers,
        sampler=Fresh(lambda: SubsetRandomSampler(list(range(0, 23, 2)))),
    )


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("replacement", [True, False])
def test_weighted_random_sampler(num_workers, replacement):
    weights = [0.1, 5.0, 1.0, 0.5, 3.0, 0.2, 2.0, 1.5, 0.7, 4.0] + [0.3] * 13
    out = run_both(
        cd.TensorLabelDataset,
        epochs=2,
        batch_size=4,
        num_workers=num_workers,
        sampler=Fresh(
            lambda: WeightedRandomSampler(
                weights, 15, replacement=replacement, generator=torch.Generator().manual_seed(11)
            )
        ),
    )
    assert sum(len(b[1]) for b in out[0]) == 15


@pytest.mark.parametrize("num_workers", [0, 2])
def test_random_sampler_with_replacement_and_num_samples(num_workers):
    ds = cd.TensorLabelDataset()
    run_both(
        lambda: ds,
        batch_size=4,
        num_workers=num_workers,
        sampler=Fresh(
            lambda: RandomSampler(
                ds, replacement=True, num_samples=40, generator=torch.Generator().manual_seed(2)
            )
        ),
    )


@pytest.mark.parametrize("num_workers", [0, 2])
def test_custom_sampler_and_plain_list_sampler(num_workers):
    out = run_both(
        cd.TensorLabelDataset, batch_size=4, num_workers=num_workers, sampler=cd.ReversedSampler(23)
    )
    assert out[0][0][1].tolist() == [22, 21, 20, 19]
    out = run_both(
        cd.TensorLabelDataset, batch_size=2, num_workers=num_workers, sampler=[5, 0, 5, 17, 2]
    )
    assert [b[1].tolist() for b in out[0]] == [[5, 0], [5, 17], [2]]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_batch_sampler_list_of_lists(num_workers):
    batches = [[0, 1, 2], [5], [3, 4], [9, 8, 7, 6], [22, 0]]
    out = run_both(cd.TensorLabelDataset, num_workers=num_workers, batch_sampler=batches)
    assert [b[1].tolist() for b in out[0]] == batches


@pytest.mark.parametrize("num_workers", [0, 2])
def test_batch_sampler_object(num_workers):
    run_both(
        cd.TensorLabelDataset,
        epochs=2,
        num_workers=num_workers,
        batch_sampler=Fresh(
            lambda: BatchSampler(
                RandomSampler(range(23), generator=torch.Generator().manual_seed(6)), 5, True
            )
        ),
    )


@pytest.mark.parametrize("num_workers", [0, 2])
def test_sampler_with_batch_size_none(num_workers):
    out = run_both(
        cd.TensorLabelDataset,
        batch_size=None,
        num_workers=num_workers,
        sampler=Fresh(lambda: RandomSampler(range(23), generator=torch.Generator().manual_seed(1))),
    )
    assert len(out[0]) == 23


# --------------------------------------------------------------------------------------------
# Iterable-style datasets


@pytest.mark.parametrize("num_workers", [0, 1, 2])
@pytest.mark.parametrize("batch_size", [None, 1, 4])
def test_iterable_sharded(num_workers, batch_size):
    out = run_both(cd.ShardedIterable, batch_size=batch_size, num_workers=num_workers)
    if batch_size is None:
        idx = [b["idx"] for b in out[0]]
    else:
        idx = torch.cat([b["idx"] for b in out[0]]).tolist()
    assert sorted(idx) == list(range(23))


@pytest.mark.filterwarnings(TOO_MANY_WORKERS)
def test_iterable_sharded_three_workers_uneven():
    out = run_both(lambda: cd.ShardedIterable(0, 10), batch_size=3, num_workers=3)
    assert sorted(torch.cat([b["idx"] for b in out[0]]).tolist()) == list(range(10))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_iterable_drop_last_is_per_worker(num_workers):
    run_both(cd.ShardedIterable, batch_size=4, drop_last=True, num_workers=num_workers)


@pytest.mark.parametrize("num_workers", [1, 2])
def test_iterable_without_sharding_duplicates_per_worker(num_workers):
    out = run_both(cd.NaiveIterable, batch_size=3, num_workers=num_workers)
    assert sum(len(b[0]) for b in out[0]) == 7 * num_workers


def test_iterable_with_custom_collate():
    run_both(cd.ShardedIterable, batch_size=5, num_workers=2, collate_fn=cd.collate_identity)


def test_iterable_shuffle_false_is_allowed():
    run_both(cd.ShardedIterable, batch_size=5, shuffle=False, num_workers=2)


@pytest.mark.parametrize("prefetch_factor", [1, 4])
def test_iterable_prefetch_factor(prefetch_factor):
    run_both(cd.ShardedIterable, batch_size=2, num_workers=2, prefetch_factor=prefetch_factor)


# --------------------------------------------------------------------------------------------
# len()


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"batch_size": 4},
        {"batch_size": 4, "drop_last": True},
        {"batch_size": 23},
        {"batch_size": 50, "drop_last": True},
        {"batch_size": None},
        {"batch_size": 3, "sampler": [0, 1, 2, 3]},
        {"batch_sampler": [[0], [1, 2], [3, 4, 5]]},
        {"batch_size": 4, "num_workers": 2},
        {"batch_size": 4, "shuffle": True},
    ],
    ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "defaults",
)
def test_len_map_style(kwargs):
    lens = {impl: len(make_loader(impl, cd.TensorLabelDataset(), **kwargs)) for impl in LOADERS}
    assert lens["stoker"] == lens["torch"]


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"batch_size": 4}, {"batch_size": 4, "drop_last": True}, {"batch_size": None}],
    ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "defaults",
)
def test_len_iterable_with_len(kwargs):
    lens = {impl: len(make_loader(impl, cd.SizedShardedIterable(), **kwargs)) for impl in LOADERS}
    assert lens["stoker"] == lens["torch"]


def test_len_iterable_without_len_raises_type_error():
    with pytest.raises(TypeError):
        len(DataLoader(cd.ShardedIterable(), batch_size=2))
    with pytest.raises(TypeError):
        len(stoker.DataLoader(cd.ShardedIterable(), batch_size=2))


# --------------------------------------------------------------------------------------------
# collate_fn


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize(
    "collate_fn",
    [
        cd.collate_to_numpy,
        cd.collate_to_namedtuple,
        cd.collate_to_dict_with_strings,
        cd.collate_identity,
        default_collate,
    ],
    ids=lambda f: f.__name__,
)
def test_custom_collate_fn(num_workers, collate_fn):
    out = run_both(
        cd.TensorLabelDataset, batch_size=4, num_workers=num_workers, collate_fn=collate_fn
    )
    if collate_fn is cd.collate_to_numpy:
        assert type(out[0][0][0]) is np.ndarray
    if collate_fn is cd.collate_to_namedtuple:
        assert type(out[0][0]) is cd.Pair


@pytest.mark.parametrize("num_workers", [0, 2])
def test_collate_fn_with_batch_size_none_is_per_sample(num_workers):
    out = run_both(
        cd.TensorLabelDataset,
        batch_size=None,
        num_workers=num_workers,
        collate_fn=cd.collate_sum_per_sample,
    )
    assert len(out[0]) == 23 and out[0][1]["label"] == 1


@pytest.mark.parametrize("num_workers", [0, 2])
def test_default_convert_explicit_with_batch_size_none(num_workers):
    run_both(
        cd.NumpyDtypeDataset, batch_size=None, num_workers=num_workers, collate_fn=default_convert
    )


# --------------------------------------------------------------------------------------------
# Sample structures and dtypes


@pytest.mark.parametrize("num_workers", [0, 2])
def test_nested_structures(num_workers):
    out = run_both(cd.NestedDataset, batch_size=3, num_workers=num_workers)
    first = out[0][0]
    assert type(first["point"]) is cd.Point
    assert type(first["pair"]) is list  # default_collate turns tuples into lists
    assert first["name"] == ["item-0", "item-1", "item-2"]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_numpy_dtypes(num_workers):
    out = run_both(cd.NumpyDtypeDataset, batch_size=3, num_workers=num_workers)
    first = out[0][0]
    for name in cd.NUMPY_DTYPES:
        assert first[f"arr_{name}"].dtype == torch.from_numpy(np.zeros(1, dtype=name)).dtype
    assert first["scalar_float32"].dtype == torch.float32


@pytest.mark.parametrize("num_workers", [0, 2])
def test_torch_dtypes(num_workers):
    out = run_both(cd.TorchDtypeDataset, batch_size=3, num_workers=num_workers)
    assert {v.dtype for v in out[0][0].values()} == set(cd.TORCH_DTYPES)


@pytest.mark.parametrize("batch_size", [None, 2])
def test_exotic_torch_dtypes(batch_size):
    run_both(
        lambda: cd.TorchDtypeDataset(4, cd.EXOTIC_TORCH_DTYPES),
        batch_size=batch_size,
        num_workers=2,
    )


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("batch_size", [None, 4])
def test_python_and_numpy_scalars_str_bytes(num_workers, batch_size):
    out = run_both(cd.ScalarsDataset, batch_size=batch_size, num_workers=num_workers)
    if batch_size is not None:
        first = out[0][0]
        assert first["float"].dtype == torch.float64  # python floats collate to float64
        assert first["bool"].dtype == torch.bool  # python bools collate to bool
        assert first["str"] == ["s0", "s1", "s2", "s3"]
        assert type(first["bytes"][0]) is bytes


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("batch_size", [None, 3])
def test_non_contiguous_and_zero_size_tensors(num_workers, batch_size):
    out = run_both(cd.OddTensorsDataset, batch_size=batch_size, num_workers=num_workers)
    if batch_size is not None:
        assert out[0][0]["empty_rows"].shape == (3, 0, 3)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_unbatched_non_contiguous_tensors_keep_strides(num_workers):
    """With batch_size=None torch hands the worker's tensor over as-is, strides included."""
    strides = {}
    for impl in LOADERS:
        loader = make_loader(impl, cd.OddTensorsDataset(), batch_size=None, num_workers=num_workers)
        strides[impl] = [
            {k: (v.stride(), v.is_contiguous()) for k, v in b.items() if torch.is_tensor(v)}
            for b in loader
        ]
    assert strides["stoker"] == strides["torch"]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_large_samples(num_workers):
    out = run_both(cd.LargeDataset, batch_size=2, num_workers=num_workers)
    assert out[0][1][0].shape == (2, cd.LARGE_NUMEL)


def test_large_samples_unbatched():
    run_both(cd.LargeDataset, batch_size=None, num_workers=2)


# --------------------------------------------------------------------------------------------
# __getitems__


@pytest.mark.parametrize("num_workers", [0, 2])
def test_getitems_is_used_for_batches(num_workers):
    out = run_both(cd.GetItemsDataset, batch_size=4, num_workers=num_workers)
    assert all(bool(b["via_getitems"].all()) for b in out[0])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_getitems_not_used_without_auto_collation(num_workers):
    out = run_both(cd.GetItemsDataset, batch_size=None, num_workers=num_workers)
    assert not any(b["via_getitems"] for b in out[0])


def test_getitems_with_identity_collate_and_batch_sampler():
    out = run_both(
        cd.GetItemsDataset,
        num_workers=2,
        batch_sampler=[[3, 1], [0], [10, 9, 8]],
        collate_fn=cd.collate_identity,
    )
    assert [[s["idx"] for s in b] for b in out[0]] == [[3, 1], [0], [10, 9, 8]]


def test_getitems_set_to_none_falls_back_to_getitem():
    out = run_both(cd.DisabledGetItemsDataset, batch_size=4, num_workers=2)
    assert not any(bool(b["via_getitems"].any()) for b in out[0])


# --------------------------------------------------------------------------------------------
# pin_memory, timeout, prefetch_factor, in_order


@pytest.mark.parametrize("num_workers", [0, 2])
def test_pin_memory(num_workers):
    results = {}
    for impl in LOADERS:
        if torch.accelerator.is_available():
            loader = make_loader(
                impl, cd.NestedDataset(), batch_size=3, pin_memory=True, num_workers=num_workers
            )
            results[impl] = collect(loader)
            assert results[impl][0][0]["point"].x.is_pinned()
        else:
            with pytest.warns(UserWarning, match="pin_memory"):
                loader = make_loader(
                    impl, cd.NestedDataset(), batch_size=3, pin_memory=True, num_workers=num_workers
                )
                results[impl] = collect(loader)
    assert_same(results["torch"], results["stoker"])


def test_positive_timeout_that_does_not_fire():
    run_both(cd.TensorLabelDataset, batch_size=4, num_workers=2, timeout=30)


@pytest.mark.parametrize("prefetch_factor", [1, 4])
def test_prefetch_factor(prefetch_factor):
    run_both(
        cd.RandomAugDataset,
        batch_size=2,
        num_workers=2,
        prefetch_factor=prefetch_factor,
        generator=gen(3),
    )


def test_in_order_true():
    run_both(cd.RandomAugDataset, batch_size=2, num_workers=2, in_order=True, generator=gen(4))


def test_in_order_false_yields_same_samples():
    samples = {}
    for impl in LOADERS:
        loader = make_loader(
            impl, cd.TensorLabelDataset(), batch_size=3, num_workers=2, in_order=False
        )
        samples[impl] = sorted(
            (y, x.tolist()) for xs, ys in loader for x, y in zip(xs, ys.tolist())
        )
    assert samples["stoker"] == samples["torch"]
    assert [y for y, _ in samples["torch"]] == list(range(23))


# --------------------------------------------------------------------------------------------
# Worker seeding, worker_init_fn, get_worker_info


@pytest.mark.parametrize("num_workers", [0, 1, 2])
def test_random_augmentation_in_workers_with_generator(num_workers):
    out = run_both(
        cd.RandomAugDataset,
        epochs=2,
        batch_size=2,
        shuffle=True,
        num_workers=num_workers,
        generator=gen(2024),
    )
    draws = torch.cat([b["torch"] for b in flat(out)])
    assert len(set(draws.flatten().tolist())) == draws.numel()  # really random, not constant


@pytest.mark.parametrize("num_workers", [0, 2])
def test_random_augmentation_in_workers_with_global_seed(num_workers):
    run_both(cd.RandomAugDataset, epochs=2, seed=31, batch_size=3, num_workers=num_workers)


def test_persistent_workers_three_epochs_random_augmentation():
    out = run_both(
        cd.RandomAugDataset,
        epochs=3,
        batch_size=2,
        shuffle=True,
        num_workers=2,
        persistent_workers=True,
        generator=gen(77),
    )
    per_epoch = [sorted(torch.cat([b["torch_int"] for b in epoch]).tolist()) for epoch in out]
    assert per_epoch[0] != per_epoch[1] != per_epoch[2]  # worker RNG carries on across epochs


def test_persistent_workers_three_epochs_global_seed():
    run_both(
        cd.RandomAugDataset,
        epochs=3,
        seed=123,
        batch_size=3,
        shuffle=True,
        num_workers=2,
        persistent_workers=True,
    )


def test_persistent_workers_iterable_three_epochs():
    run_both(
        cd.StridedRandomIterable,
        epochs=3,
        batch_size=3,
        num_workers=2,
        persistent_workers=True,
        generator=gen(5),
    )


def test_persistent_workers_keep_worker_init_state():
    out = run_both(
        cd.TaggedDataset,
        epochs=3,
        batch_size=2,
        num_workers=2,
        persistent_workers=True,
        worker_init_fn=cd.init_seed_numpy_from_worker_seed,
        generator=gen(9),
    )
    # strings inside sequence samples collate to the tuple zip() made, not to a list
    assert out[0][0][1] == ("seeded-0", "seeded-0")


@pytest.mark.parametrize("num_workers", [1, 2])
def test_worker_init_fn_tags_dataset_copy(num_workers):
    out = run_both(
        cd.TaggedDataset, batch_size=2, num_workers=num_workers, worker_init_fn=cd.init_tag_dataset
    )
    tags = {t for b in out[0] for t in b[1]}
    assert tags == {f"worker-{w}-of-{num_workers}" for w in range(num_workers)}


def test_worker_init_fn_via_stoker_get_worker_info():
    """stoker.get_worker_info() works in stoker's workers and sees the same dataset copy."""
    results = {}
    for impl, init_fn in (("torch", cd.init_tag_dataset), ("stoker", cd.init_tag_dataset_stoker)):
        loader = make_loader(
            impl, cd.TaggedDataset(), batch_size=2, num_workers=2, worker_init_fn=init_fn
        )
        results[impl] = [[t.split("worker-")[1] for t in b[1]] for b in loader]
    assert results["stoker"] == results["torch"]


def test_worker_init_fn_seeding_numpy_from_worker_seed():
    out = run_both(
        cd.TaggedDataset,
        batch_size=2,
        num_workers=2,
        worker_init_fn=cd.init_seed_numpy_from_worker_seed,
        generator=gen(42),
    )
    assert len({float(d) for b in out[0] for d in b[2]}) == 2


def test_worker_init_fn_does_not_touch_main_process_dataset():
    for impl in LOADERS:
        ds = cd.TaggedDataset()
        collect(
            make_loader(impl, ds, batch_size=2, num_workers=2, worker_init_fn=cd.init_tag_dataset)
        )
        assert ds.tag == "main", impl


@pytest.mark.parametrize("num_workers", [0, 1, 2])
@pytest.mark.parametrize("api", ["torch", "stoker"])
def test_get_worker_info_inside_workers(num_workers, api):
    """Both torch's and stoker's get_worker_info() report what torch's reports under torch."""
    results = {}
    for impl in LOADERS:
        seed_everything(0)
        ds_api = api if impl == "stoker" else "torch"
        loader = make_loader(
            impl,
            cd.WorkerInfoDataset(8, api=ds_api),
            batch_size=None,
            num_workers=num_workers,
            generator=torch.Generator().manual_seed(10),
        )
        results[impl] = collect(loader)
    assert_same(results["torch"], results["stoker"])
    samples = results["torch"][0]
    if num_workers:
        assert all(s["in_worker"] and s["dataset_is_self"] for s in samples)
        assert {s["id"] for s in samples} == set(range(num_workers))
        assert len({s["seed"] for s in samples}) == num_workers
    else:
        assert not any(s["in_worker"] for s in samples)


def test_get_worker_info_is_none_in_main_process():
    assert stoker.get_worker_info() is None
    assert torch.utils.data.get_worker_info() is None
    collect(stoker.DataLoader(cd.TensorLabelDataset(), batch_size=4, num_workers=2))
    assert stoker.get_worker_info() is None
    assert torch.utils.data.get_worker_info() is None


# --------------------------------------------------------------------------------------------
# multiprocessing_context


@pytest.mark.parametrize(
    "context",
    ["fork", torch_mp.get_context("fork"), multiprocessing.get_context("fork")],
    ids=["str", "torch-ctx", "stdlib-ctx"],
)
def test_multiprocessing_context_fork(context):
    run_both(
        cd.RandomAugDataset,
        batch_size=3,
        num_workers=2,
        multiprocessing_context=context,
        generator=gen(0),
    )


@pytest.mark.parametrize(
    "context",
    [
        "spawn",
        multiprocessing.get_context("spawn"),
        "forkserver",
        torch_mp.get_context("forkserver"),
    ],
    ids=["spawn-str", "spawn-stdlib-ctx", "forkserver-str", "forkserver-torch-ctx"],
)
def test_multiprocessing_context_spawn_and_forkserver(context):
    """Slow (workers re-import torch): checks seeding, worker info and init_fn in one go."""
    out = run_both(
        cd.WorkerInfoDataset,
        batch_size=2,
        num_workers=2,
        multiprocessing_context=context,
        worker_init_fn=cd.init_tag_dataset,
        generator=gen(8),
    )
    assert set(flat(out)[0]["tag"]) == {"worker-0-of-2"}


def test_spawn_with_persistent_workers_and_random_augmentation():
    run_both(
        cd.RandomAugDataset,
        epochs=2,
        batch_size=3,
        num_workers=2,
        shuffle=True,
        persistent_workers=True,
        multiprocessing_context="spawn",
        generator=gen(13),
    )


# --------------------------------------------------------------------------------------------
# Iteration protocol: break, re-iterate, several iterators


def _take(it, n):
    return [next(it) for _ in range(n)]


@pytest.mark.parametrize(
    "num_workers,persistent", [(0, False), (2, False), (2, True)], ids=["0", "2", "2-persistent"]
)
def test_early_break_then_reiterate(num_workers, persistent):
    seen = {}
    for impl in LOADERS:
        seed_everything(0)
        loader = make_loader(
            impl,
            cd.RandomAugDataset(),
            batch_size=2,
            shuffle=True,
            num_workers=num_workers,
            persistent_workers=persistent,
            generator=torch.Generator().manual_seed(21),
        )
        partial = []
        for i, batch in enumerate(loader):
            partial.append(batch)
            if i == 1:
                break
        seen[impl] = (partial, collect(loader, epochs=2))
        del loader, batch
    assert_same(seen["torch"], seen["stoker"])
    assert len(seen["torch"][1][0]) == 6


@pytest.mark.parametrize("num_workers", [0, 2])
def test_two_interleaved_iterators(num_workers):
    seen = {}
    for impl in LOADERS:
        seed_everything(0)
        loader = make_loader(
            impl,
            cd.RandomAugDataset(),
            batch_size=3,
            shuffle=True,
            num_workers=num_workers,
            generator=torch.Generator().manual_seed(3),
        )
        it1, it2 = iter(loader), iter(loader)
        order = _take(it1, 1) + _take(it2, 2) + _take(it1, 2) + list(it2) + list(it1)
        seen[impl] = order
    assert_same(seen["torch"], seen["stoker"])
    assert len(seen["torch"]) == 8


def test_iterator_is_its_own_iterator_and_stops_repeatedly():
    for impl in LOADERS:
        it = iter(make_loader(impl, cd.TensorLabelDataset(4), batch_size=2, num_workers=2))
        assert iter(it) is it
        assert len(list(it)) == 2
        with pytest.raises(StopIteration):
            next(it)


# --------------------------------------------------------------------------------------------
# Errors: invalid arguments and errors raised in workers


def _outcome(impl, make_dataset, kwargs):
    """``(phase, exception type)`` of constructing the loader and fetching its first batch."""
    try:
        loader = make_loader(impl, make_dataset(), **kwargs)
    except Exception as e:  # the type is what we compare
        return "construct", type(e)
    try:
        next(iter(loader))
    except Exception as e:
        return "iterate", type(e)
    return "ok", None


def _drain_recording_errors(it, limit=50):
    """Exhaust ``it``; failed ``next`` calls become ``("error", type name, mentions index 5)``.

    Draining (rather than abandoning the iterator inside pytest.raises) lets workers shut down
    at once: an abandoned iterator is kept alive by the traceback's reference cycle.
    """
    out = []
    for _ in range(limit):
        try:
            out.append(next(it))
        except StopIteration:
            return out
        except Exception as e:
            out.append(("error", type(e).__name__, "bad index 5" in str(e)))
    raise AssertionError(f"iterator did not stop after {limit} items")


MAP = cd.TensorLabelDataset
ITER = cd.ShardedIterable
INVALID_ARGS = [
    ("num_workers=-1", MAP, {"num_workers": -1}, ("construct", ValueError)),
    ("timeout=-1", MAP, {"timeout": -1}, ("construct", ValueError)),
    ("prefetch_no_workers", MAP, {"prefetch_factor": 2}, ("construct", ValueError)),
    ("prefetch=-1", MAP, {"num_workers": 2, "prefetch_factor": -1}, ("construct", ValueError)),
    # torch accepts prefetch_factor=0 in the constructor and asserts when iterating
    ("prefetch=0", MAP, {"num_workers": 2, "prefetch_factor": 0}, ("iterate", AssertionError)),
    ("persistent_no_workers", MAP, {"persistent_workers": True}, ("construct", ValueError)),
    ("sampler+shuffle", MAP, {"sampler": [0, 1], "shuffle": True}, ("construct", ValueError)),
    (
        "batch_sampler+batch_size",
        MAP,
        {"batch_sampler": [[0, 1]], "batch_size": 2},
        ("construct", ValueError),
    ),
    (
        "batch_sampler+shuffle",
        MAP,
        {"batch_sampler": [[0, 1]], "shuffle": True},
        ("construct", ValueError),
    ),
    (
        "batch_sampler+sampler",
        MAP,
        {"batch_sampler": [[0, 1]], "sampler": [0, 1]},
        ("construct", ValueError),
    ),
    (
        "batch_sampler+drop_last",
        MAP,
        {"batch_sampler": [[0, 1]], "drop_last": True},
        ("construct", ValueError),
    ),
    (
        "batch_size=None+drop_last",
        MAP,
        {"batch_size": None, "drop_last": True},
        ("construct", ValueError),
    ),
    ("batch_size=0", MAP, {"batch_size": 0}, ("construct", ValueError)),
    ("batch_size=-3", MAP, {"batch_size": -3}, ("construct", ValueError)),
    ("drop_last='yes'", MAP, {"batch_size": 2, "drop_last": "yes"}, ("construct", ValueError)),
    ("iterable+shuffle", ITER, {"shuffle": True}, ("construct", ValueError)),
    ("iterable+sampler", ITER, {"sampler": [0, 1]}, ("construct", ValueError)),
    ("iterable+batch_sampler", ITER, {"batch_sampler": [[0, 1]]}, ("construct", ValueError)),
    (
        "bad_context_str",
        MAP,
        {"num_workers": 2, "multiprocessing_context": "bogus"},
        ("construct", ValueError),
    ),
    (
        "bad_context_type",
        MAP,
        {"num_workers": 2, "multiprocessing_context": 123},
        ("construct", TypeError),
    ),
    (
        "context_no_workers",
        MAP,
        {"multiprocessing_context": "fork"},
        ("construct", ValueError),
    ),
    # torch accepts a timeout with num_workers=0 and asserts when iterating
    ("timeout_no_workers", MAP, {"timeout": 5}, ("iterate", AssertionError)),
    # controls: valid combinations that must not raise
    ("iterable+shuffle=False", ITER, {"shuffle": False}, ("ok", None)),
    ("batch_sampler_only", MAP, {"batch_sampler": [[0, 1]], "batch_size": 1}, ("ok", None)),
    ("sampler+shuffle=False", MAP, {"sampler": [0, 1], "shuffle": False}, ("ok", None)),
]


@pytest.mark.parametrize(
    "make_dataset,kwargs,expected",
    [case[1:] for case in INVALID_ARGS],
    ids=[case[0] for case in INVALID_ARGS],
)
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # torch's __del__
def test_invalid_arguments_raise_like_torch(make_dataset, kwargs, expected):
    assert _outcome("torch", make_dataset, kwargs) == expected  # documents torch's behaviour
    assert _outcome("stoker", make_dataset, kwargs) == expected


@pytest.mark.parametrize("attr", ["batch_size", "sampler", "batch_sampler", "drop_last", "dataset"])
def test_setting_frozen_attribute_after_init_raises(attr):
    for impl in LOADERS:
        loader = make_loader(impl, cd.TensorLabelDataset(), batch_size=2)
        with pytest.raises(ValueError):
            setattr(loader, attr, getattr(loader, attr))


def test_too_many_workers_warns():
    too_many = len(os.sched_getaffinity(0)) + 1
    for impl in LOADERS:
        with pytest.warns(UserWarning, match="worker"):
            make_loader(impl, cd.TensorLabelDataset(), num_workers=too_many)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("exc_type", [ValueError, KeyError, IndexError])
def test_dataset_exception_type_propagates(num_workers, exc_type):
    for impl in LOADERS:
        loader = make_loader(
            impl, cd.FailingDataset(exc_type=exc_type), batch_size=2, num_workers=num_workers
        )
        outcome = _drain_recording_errors(iter(loader))
        assert_same(
            outcome,
            [
                torch.tensor([0, 1]),
                torch.tensor([2, 3]),
                ("error", exc_type.__name__, True),
                torch.tensor([6, 7]),  # torch keeps going after a failed batch
            ],
        )


@pytest.mark.parametrize("num_workers", [0, 2])
def test_default_collate_error_propagates(num_workers):
    outcomes = {}
    for impl in LOADERS:
        loader = make_loader(impl, cd.NumpyStringDataset(), batch_size=2, num_workers=num_workers)
        outcomes[impl] = _drain_recording_errors(iter(loader))
    assert_same(outcomes["torch"], outcomes["stoker"])
    assert outcomes["torch"][0][:2] == ("error", "TypeError")


# --------------------------------------------------------------------------------------------
# Public attributes


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"batch_size": 4, "shuffle": True, "drop_last": True},
        {"batch_size": None, "num_workers": 2},
        {"batch_sampler": [[0, 1], [2]]},
        {"num_workers": 2, "prefetch_factor": 4, "persistent_workers": True, "timeout": 3.5},
        {"num_workers": 1, "in_order": False, "pin_memory": True},
    ],
    ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "defaults",
)
def test_public_attributes_match(kwargs):
    attrs = {}
    for impl in LOADERS:
        ds = cd.TensorLabelDataset()
        g = torch.Generator()
        loader = make_loader(impl, ds, generator=g, **kwargs)
        assert loader.dataset is ds and loader.generator is g
        attrs[impl] = loader
    t, s = attrs["torch"], attrs["stoker"]
    for name in (
        "batch_size",
        "drop_last",
        "num_workers",
        "prefetch_factor",
        "persistent_workers",
        "pin_memory",
        "timeout",
        "in_order",
    ):
        assert getattr(s, name) == getattr(t, name), name
    assert isinstance(s.sampler, type(t.sampler))
    if t.batch_sampler is None:
        assert s.batch_sampler is None
    else:
        assert isinstance(s.batch_sampler, type(t.batch_sampler))


def test_user_sampler_is_exposed_unchanged():
    for impl in LOADERS:
        sampler = SequentialSampler(range(23))
        batch_sampler = BatchSampler(sampler, 3, False)
        assert make_loader(impl, cd.TensorLabelDataset(), sampler=sampler).sampler is sampler
        loader = make_loader(impl, cd.TensorLabelDataset(), batch_sampler=batch_sampler)
        assert loader.batch_sampler is batch_sampler


def test_no_extra_warnings_for_plain_use():
    caught = {}
    for impl in LOADERS:
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            collect(make_loader(impl, cd.TensorLabelDataset(), batch_size=4, num_workers=2))
        caught[impl] = sorted({(w.category.__name__, str(w.message)) for w in record})
    assert caught["stoker"] == caught["torch"]
