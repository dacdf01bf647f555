"""Other loaders in the same harness, each optional: skipped with the reason when missing.

Each peer gets the same dataset, batch size, shuffling seed, worker count and collate function,
and loads through its own multi-process mechanism:

* torchdata.nodes: ``ParallelMapper(method="process")`` over batches of indices;
* Grain: ``MapDataset.source(...).shuffle().batch()`` then ``mp_prefetch`` with N processes;
* SPDL: ``PipelineBuilder`` with one stage on a ``ProcessPoolExecutor`` of N processes.
"""

from __future__ import annotations

PEERS = ("torchdata", "grain", "spdl")
_MODULES = {"torchdata": "torchdata.nodes", "grain": "grain", "spdl": "spdl.pipeline"}


def available(name: str) -> tuple[bool, str]:
    import importlib

    try:
        importlib.import_module(_MODULES[name])
    except Exception as e:
        return False, f"{_MODULES[name]} not importable ({type(e).__name__}: {e}); " \
                      f"pip install {name}"
    return True, ""


class _FetchBatch:
    def __init__(self, dataset, collate):
        self.dataset = dataset
        self.collate = collate

    def __call__(self, indices):
        return self.collate([self.dataset[i] for i in indices])


def _batches(dataset, kwargs):
    from torch.utils.data import BatchSampler, RandomSampler

    sampler = RandomSampler(dataset, generator=kwargs["generator"])
    return BatchSampler(sampler, kwargs["batch_size"], drop_last=False)


def _collate(kwargs):
    from torch.utils.data._utils.collate import default_collate

    return kwargs.get("collate_fn") or default_collate


class _TorchdataLoader:
    def __init__(self, dataset, kwargs):
        self.dataset, self.kwargs = dataset, kwargs

    def __iter__(self):
        from torchdata.nodes import IterableWrapper, Loader, ParallelMapper

        node = ParallelMapper(
            IterableWrapper(_batches(self.dataset, self.kwargs)),
            map_fn=_FetchBatch(self.dataset, _collate(self.kwargs)),
            num_workers=self.kwargs["num_workers"],
            method="process",
            in_order=True,
        )
        return iter(Loader(node))


class _Source:
    """A plain Sequence view of a dataset (Grain's MapDataset.source wants len + getitem)."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        return self.dataset[i]


class _GrainLoader:
    def __init__(self, dataset, kwargs):
        self.dataset, self.kwargs = dataset, kwargs

    def __iter__(self):
        import grain

        ds = (grain.MapDataset.source(_Source(self.dataset))
              .shuffle(seed=0)
              .batch(self.kwargs["batch_size"], batch_fn=_collate(self.kwargs)))
        options = grain.MultiprocessingOptions(num_workers=self.kwargs["num_workers"],
                                               per_worker_buffer_size=2)
        return iter(ds.to_iter_dataset().mp_prefetch(options))


class _SpdlLoader:
    def __init__(self, dataset, kwargs):
        self.dataset, self.kwargs = dataset, kwargs

    def __iter__(self):
        from concurrent.futures import ProcessPoolExecutor

        from spdl.pipeline import PipelineBuilder

        workers = self.kwargs["num_workers"]
        executor = ProcessPoolExecutor(max_workers=workers)
        pipeline = (PipelineBuilder()
                    .add_source([list(b) for b in _batches(self.dataset, self.kwargs)])
                    .pipe(_FetchBatch(self.dataset, _collate(self.kwargs)),
                          concurrency=2 * workers, executor=executor, output_order="input")
                    .add_sink(2 * workers)
                    .build(num_threads=1))
        with pipeline.auto_stop():
            yield from pipeline
        executor.shutdown()


def make(name: str, dataset, kwargs):
    return {"torchdata": _TorchdataLoader, "grain": _GrainLoader, "spdl": _SpdlLoader}[name](
        dataset, kwargs)
