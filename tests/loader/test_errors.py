"""Bad input gets a clear error in the main process: never a hang, never a crash."""

from __future__ import annotations

import pytest

from support.scenarios import run_ok


def test_exception_in_getitem_keeps_type_index_and_traceback():
    run_ok("errors.exception_in_getitem_keeps_type_index_and_traceback")


def test_keyerror_in_getitem_stays_keyerror():
    run_ok("errors.keyerror_in_getitem_stays_keyerror")


def test_samples_that_do_not_stack_name_index_field_and_shapes():
    run_ok("errors.samples_that_do_not_stack")


def test_unpicklable_batch_names_its_type_instead_of_hanging():
    run_ok("errors.unpicklable_batch", timeout=60)


@pytest.mark.parametrize("signame", ["SIGKILL", "SIGSEGV", "SIGBUS"])
def test_worker_killed_by_signal_is_named(signame):
    run_ok("errors.worker_killed_by_signal", signame)


def test_worker_exit_code_is_named():
    run_ok("errors.worker_exit_code")


def test_no_worker_or_fd_survives_errors():
    run_ok("errors.no_worker_or_fd_survives_errors")


@pytest.mark.unit
@pytest.mark.parametrize(
    "kwargs, exc",
    [
        ({"num_workers": -1}, ValueError),
        ({"timeout": -1}, ValueError),
        ({"prefetch_factor": 2}, ValueError),
        ({"persistent_workers": True}, ValueError),
        ({"shuffle": True, "sampler": [0, 1]}, ValueError),
        ({"batch_sampler": [[0]], "batch_size": 2}, ValueError),
        ({"num_workers": 1, "multiprocessing_context": "nonsense"}, ValueError),
        ({"num_workers": 1, "multiprocessing_context": 42}, TypeError),
    ],
)
def test_invalid_arguments_raise_what_torch_raises(kwargs, exc):
    import torch

    import stoker
    from scenario_datasets import Squares

    with pytest.raises(exc) as theirs:
        torch.utils.data.DataLoader(Squares(), **kwargs)
    with pytest.raises(exc) as ours:
        stoker.DataLoader(Squares(), **kwargs)
    assert str(ours.value) == str(theirs.value)


def test_slot_rewritten_before_it_was_read_is_named():
    run_ok("errors.slot_rewritten_before_it_was_read", timeout=60)
