"""Hugging Face datasets (map-style with_format("torch"), streaming from local JSON files),
webdataset (WebDataset + DataLoader, WebLoader) and torchdata's StatefulDataLoader, under
stoker.enable() and through stoker.DataLoader. Tiny data is written to DIR. Prints one JSON line
per case: the rows seen, who served the loader, whether stoker workers loaded them."""

import json
import logging
import os
import sys

import torch

import stoker

DIR = sys.argv[1]
logging.basicConfig(level=logging.WARNING, format="LOG %(message)s")


def flag(_=None):
    return int(stoker.get_worker_info() is not None)


def show(case, loader, rows_of):
    rows = []
    for batch in loader:
        rows += rows_of(batch)
    print("CASE", json.dumps({"case": case, "rows": sorted(rows),
                              "served_by": stoker.stats(loader)["served_by"]}), flush=True)


class Flagged(torch.utils.data.Dataset):
    """Adds to each row whether a stoker worker loaded it."""

    def __init__(self, ds):
        self.ds = ds

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        row = self.ds[i]
        return {"a": row["a"], "engine": flag()}


def hf_datasets(kind):
    import datasets

    ds = datasets.Dataset.from_dict({"a": list(range(12))}).with_format("torch")
    loader_cls = stoker.DataLoader if kind == "stoker" else torch.utils.data.DataLoader
    dl = loader_cls(Flagged(ds), batch_size=4, num_workers=2)
    show(f"datasets-map-{kind}", dl, lambda b: [(int(a), int(e)) for a, e in
                                                zip(b["a"], b["engine"])])
    path = os.path.join(DIR, "rows")
    os.makedirs(path, exist_ok=True)
    for shard in range(2):  # two files: one per worker
        with open(os.path.join(path, f"part{shard}.jsonl"), "w") as f:
            for i in range(shard * 6, shard * 6 + 6):
                f.write(json.dumps({"a": i}) + "\n")
    stream = datasets.load_dataset("json", data_files=os.path.join(path, "*.jsonl"),
                                   split="train", streaming=True)
    stream = stream.map(lambda r: {"a": r["a"], "engine": flag()}).with_format("torch")
    dl = loader_cls(stream, batch_size=4, num_workers=2)
    show(f"datasets-stream-{kind}", dl, lambda b: [(int(a), int(e)) for a, e in
                                                   zip(b["a"], b["engine"])])


def webdataset_cases(kind):
    import webdataset as wds

    urls = []
    for shard in range(2):
        url = os.path.join(DIR, f"shard{shard}.tar")
        with wds.TarWriter(url) as w:
            for i in range(shard * 6, shard * 6 + 6):
                w.write({"__key__": f"s{i:04d}", "a.txt": str(i)})
        urls.append(url)

    def pipeline():
        return (wds.WebDataset(urls, shardshuffle=False, empty_check=False)
                .map(lambda s: (int(s["a.txt"]), flag())).batched(3))

    rows = lambda b: [(int(a), int(e)) for a, e in zip(*b)]  # noqa: E731
    loader_cls = stoker.DataLoader if kind == "stoker" else torch.utils.data.DataLoader
    show(f"webdataset-{kind}", loader_cls(pipeline(), batch_size=None, num_workers=2), rows)
    if kind == "enable":
        wl = wds.WebLoader(pipeline(), batch_size=None, num_workers=2)
        rows_seen = []
        for b in wl:
            rows_seen += rows(b)
        inner = wl.pipeline[0]
        print("CASE", json.dumps({"case": "webloader-enable", "rows": sorted(rows_seen),
                                  "served_by": stoker.stats(inner)["served_by"]}), flush=True)


def torchdata_stateful():
    from torchdata.stateful_dataloader import StatefulDataLoader

    dl = StatefulDataLoader(list(range(8)), batch_size=2, num_workers=2)
    for _ in range(2):
        rows = [int(x) for b in dl for x in b]
    print("CASE", json.dumps({"case": "torchdata-enable", "rows": rows,
                              "served_by": stoker.stats(dl)["served_by"]}), flush=True)


if __name__ == "__main__":
    for kind in ("stoker", "enable"):
        if kind == "enable":
            stoker.enable()
        hf_datasets(kind)
        webdataset_cases(kind)
    torchdata_stateful()
