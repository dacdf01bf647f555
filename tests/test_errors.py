"""Bad input gets a clear error in the main process: never a hang, never a crash."""

from __future__ import annotations

import pytest


def test_exception_in_getitem_keeps_type_index_and_traceback(scenario):
    r = scenario("errors.exception_in_getitem_keeps_type_index_and_traceback")
    assert "OK" in r.stdout, r.stderr


def test_keyerror_in_getitem_stays_keyerror(scenario):
    r = scenario("errors.keyerror_in_getitem_stays_keyerror")
    assert "OK" in r.stdout, r.stderr


def test_samples_that_do_not_stack_name_index_field_and_shapes(scenario):
    r = scenario("errors.samples_that_do_not_stack")
    assert "OK" in r.stdout, r.stderr


def test_unpicklable_batch_names_its_type_instead_of_hanging(scenario):
    r = scenario("errors.unpicklable_batch", timeout=60)
    assert "OK" in r.stdout, r.stderr


@pytest.mark.parametrize("signame", ["SIGKILL", "SIGSEGV", "SIGBUS"])
def test_worker_killed_by_signal_is_named(scenario, signame):
    r = scenario("errors.worker_killed_by_signal", signame)
    assert "OK" in r.stdout, r.stderr


def test_worker_exit_code_is_named(scenario):
    r = scenario("errors.worker_exit_code")
    assert "OK" in r.stdout, r.stderr


def test_no_worker_or_fd_survives_errors(scenario):
    r = scenario("errors.no_worker_or_fd_survives_errors")
    assert "OK" in r.stdout, r.stderr


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


def test_slot_rewritten_before_it_was_read_is_named(scenario):
    r = scenario("errors.slot_rewritten_before_it_was_read", timeout=60)
    assert "OK" in r.stdout, r.stdout + r.stderr
