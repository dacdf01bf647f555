"""Starting workers: the multiprocessing context (``fork`` becomes ``forkserver`` once CUDA is
initialised here), and what to say when starting fails because something cannot be pickled.

Called by the thread that iterates, as an iterator starts or restarts a worker.
"""

from __future__ import annotations

import pickle
import warnings

import torch

from ...pickling import by_value as _by_value


def context_for(loader):
    """The multiprocessing context the loader's workers start with."""
    ctx = loader.multiprocessing_context
    if ctx is None:
        ctx = torch.multiprocessing.get_context()
    if ctx.get_start_method() == "fork" and _cuda_initialized():
        warnings.warn(
            "stoker: CUDA is initialised in this process, and a forked worker cannot use it (it "
            "may hang or crash). Starting workers with 'forkserver' instead. To silence this, "
            "pass multiprocessing_context='forkserver' or 'spawn', or create the DataLoader "
            "before touching CUDA.",
            stacklevel=6,
        )
        ctx = torch.multiprocessing.get_context("forkserver")
    if ctx.get_start_method() == "forkserver":
        _preload_in_forkserver(ctx)
    return ctx


# What the fork server imports once, so that every worker it forks has them already: without
# them each worker imported torch again as it started (~2 s of CPU on 3.14, whose default start
# method is forkserver), at every epoch of a loader without persistent_workers.
PRELOAD = ("torch", "stoker.worker.process")


def _preload_in_forkserver(ctx) -> None:
    """Adds PRELOAD to what the fork server imports as it starts (multiprocessing's default,
    ``__main__``, or the user's own list, is kept: this only adds). A fork server already
    running is left as it is."""
    from multiprocessing import forkserver

    # (multiprocessing has no getter for the list: read where set_forkserver_preload keeps it)
    server = getattr(forkserver, "_forkserver", None)
    mods = getattr(server, "_preload_modules", None)
    current = list(mods) if mods is not None else ["__main__"]  # ([]: the user's own choice)
    wanted = current + [m for m in PRELOAD if m not in current]
    if wanted != current:
        ctx.set_forkserver_preload(wanted)


def _cuda_initialized() -> bool:
    try:
        return bool(torch.cuda.is_initialized())
    except Exception:
        return False


def unpicklable_part(dataset) -> str | None:
    """Names the attribute of `dataset` that cannot be pickled (for spawn/forkserver), as stoker
    pickles for its workers (what pickle refuses by name goes by value: ``pickling.by_value``)."""
    try:
        _by_value.dumps(dataset)
        return None
    except Exception as e:
        top_error = e
    attrs = getattr(dataset, "__dict__", {})
    for name, value in attrs.items():
        try:
            _by_value.dumps(value)
        except Exception as e:
            inner = unpicklable_part(value) if hasattr(value, "__dict__") else None
            path = f"dataset.{name}"
            if inner:
                return inner.replace("dataset", path, 1)
            return f"{path} (a {type(value).__name__}: {e})"
    return f"the dataset itself (a {type(dataset).__name__}: {top_error})"


def start_explained(start, method: str, dataset, functions: dict) -> None:
    """Runs `start` (starting workers); a pickling failure under spawn/forkserver is warned
    about as torch does and names the part that cannot be pickled: of the dataset, or one of
    `functions` ({"collate_fn": fn, "worker_init_fn": fn})."""
    try:
        start()
    except (TypeError, AttributeError, pickle.PicklingError) as e:
        if method == "fork":
            raise
        warnings.warn(
            "Got pickle error when attempting to start a worker Process. This might be "
            "because the worker Process arguments are not picklable: with "
            f"'{method}' the dataset, collate_fn and worker_init_fn are pickled. You can "
            "also try multiprocessing_context='fork'.",
            stacklevel=5,
        )
        culprit = unpicklable_part(dataset)
        if culprit is None:
            for name, fn in functions.items():
                try:
                    _by_value.dumps(fn)
                except Exception as inner:
                    culprit = f"{name} ({fn!r}: {inner})"
                    break
        if culprit:
            raise type(e)(
                f"{e}\nstoker: starting a worker with '{method}' pickles its arguments, and "
                f"{culprit} cannot be pickled. Open it in each worker instead: "
                "stoker.per_worker(open_it) as a class attribute of the dataset opens it "
                "lazily in each worker and never pickles it; or create it in worker_init_fn, "
                "or use multiprocessing_context='fork'."
            ) from e
        raise
