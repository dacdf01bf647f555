"""stoker.placements.node.budget: the node's bound, shared by every group; a token given back
goes to the group whose neediest rank is furthest behind. No process."""

from __future__ import annotations

import pytest

from stoker.placements.node.budget import Budget

pytestmark = pytest.mark.unit


def test_two_groups_never_load_more_than_the_bound_together():
    b = Budget(2)
    assert b.take("g1", 0) and b.take("g2", 0)
    assert not b.take("g1", 0) and not b.take("g2", 0)
    b.give()
    assert b.take("g1", 0)
    assert not b.take("g2", 0)


def test_a_token_given_back_goes_to_the_group_furthest_behind():
    b = Budget(1)
    assert b.take("ahead", 0)
    assert not b.take("ahead", 9)  # its neediest rank received 9 batches
    assert not b.take("behind", 2)
    b.give()
    assert b.waiting() == ["behind", "ahead"]
    assert not b.take("ahead", 9)  # a group further behind waits: not its turn
    assert b.take("behind", 2)
    b.give()
    assert b.waiting() == ["ahead"]  # (the group that took its token left the line)


def test_a_group_that_leaves_the_line_is_not_woken():
    b = Budget(1)
    b.take("g", 0)
    b.take("h", 0)
    b.leave("h")
    b.give()
    assert b.waiting() == []
    b.give()  # (more given back than taken: never below zero)
    assert b.take("g", 0) and not b.take("g", 0)


def test_the_pool_gives_a_new_group_its_workers_share_of_the_cpus(monkeypatch):
    """A rank's hello carries cpus=1 (the same from every rank: it is in the group's key); the
    pool makes the group's config with the node budget's share (``budget.worker_cpus``)."""
    import os

    from stoker.config.load import LoadSettings
    from stoker.placements.node import server, wire
    from stoker.worker.loop import WorkerConfig

    made = []

    class FakeGroup:
        clients = 1

        def attach(self, cid, pid):
            pass

        def expect(self, more):
            pass

        def pids(self):
            return ()

    def group(m, sealed, stdio):
        made.append(m.config)
        sealed.close()
        return FakeGroup()

    pool = server.Pool.__new__(server.Pool)
    pool.job, pool.budget, pool._groups, pool.lock = "j", None, {}, __import__("threading").Lock()
    pool.ranks = type("Ranks", (), {"joined": lambda self, *a: False})()
    pool._group, pool.send = group, lambda cid, m: None
    asked = []
    monkeypatch.setattr(server, "worker_cpus", lambda limit, ranks: asked.append(
        (limit, ranks)) or 7)
    config = WorkerConfig(num_workers=2, kind=0, dataset=None, auto_collation=True,
                          collate_fn=None, collate_mode=0, drop_last=False, base_seed=0,
                          load=LoadSettings(threads="auto"))
    hello = wire.Hello("key", config, 4, 2, "0", 1)
    session = type("S", (), {"cid": 1, "pid": os.getpid(), "group": None})()
    pool.join(session, hello, [os.memfd_create("sealed"), os.open(os.devnull, os.O_RDONLY),
                                os.open(os.devnull, os.O_RDONLY)])
    assert made[0].num_workers == 4 and pool.budget.limit == 4
    assert made[0].load == LoadSettings(threads="auto", cpus=7) and asked == [(4, 2)]
