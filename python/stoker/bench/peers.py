"""Other loaders in the same harness, each optional: skipped with the reason when missing."""

from __future__ import annotations

PEERS = ("torchdata",)


def available(name: str) -> tuple[bool, str]:
    if name == "torchdata":
        try:
            import torchdata.nodes  # noqa: F401
        except Exception as e:
            return False, f"torchdata.nodes not importable ({type(e).__name__}: {e}); " \
                          "pip install torchdata"
        return True, ""
    return False, "unknown peer"


class _TorchdataLoader:
    """torchdata.nodes: sampler -> ParallelMapper(method='process') over batches -> Loader."""

    def __init__(self, dataset, kwargs):
        self.dataset = dataset
        self.kwargs = kwargs

    def __iter__(self):
        import torch
        from torch.utils.data import BatchSampler, RandomSampler
        from torch.utils.data._utils.collate import default_collate
        from torchdata.nodes import IterableWrapper, Loader, ParallelMapper

        sampler = RandomSampler(self.dataset, generator=self.kwargs["generator"])
        batches = BatchSampler(sampler, self.kwargs["batch_size"], drop_last=False)
        collate = self.kwargs.get("collate_fn") or default_collate
        node = ParallelMapper(
            IterableWrapper(batches),
            map_fn=_FetchBatch(self.dataset, collate),
            num_workers=self.kwargs["num_workers"],
            method="process",
            in_order=True,
        )
        del torch
        return iter(Loader(node))


class _FetchBatch:
    def __init__(self, dataset, collate):
        self.dataset = dataset
        self.collate = collate

    def __call__(self, indices):
        return self.collate([self.dataset[i] for i in indices])


def make(name: str, dataset, kwargs):
    if name == "torchdata":
        return _TorchdataLoader(dataset, kwargs)
    raise ValueError(name)
