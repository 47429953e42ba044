"""rendezvous/attempt_store.py: each torchrun restart has a key space of its own on the agent's store.

torch 2.13's own path (`init_method="tcp://..."` under TORCHELASTIC_USE_AGENT_STORE=True, torch/distributed/
rendezvous.py `_create_c10d_store`) hands every restart the same keys: under the static rendezvous, whose agent
keeps its store across restarts, a restarted rank can read the previous incarnation's gloo address, and its
connectFullMesh is refused (issue 69). The first test pins that torch behaviour, the reason for the module.
"""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist

from rendezvous.attempt_store import attempt_prefix, process_group_store

TIMEOUT = timedelta(seconds=10)


def agent_store() -> dist.TCPStore:
    """What torchrun's static rendezvous serves (static_tcp_rendezvous.py: one TCPStore, multi-tenant)."""
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT, multi_tenant=True)


def environment(restart: int) -> dict[str, str]:
    return {"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": str(restart)}


def test_torchs_tcp_init_method_shows_a_restart_the_previous_incarnations_keys(monkeypatch):
    server = agent_store()
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    first, _, _ = next(dist.rendezvous(f"tcp://127.0.0.1:{server.port}?rank=1&world_size=2", timeout=TIMEOUT))
    first.set("rank_0_address", "the first incarnation's port")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    restarted, _, _ = next(dist.rendezvous(f"tcp://127.0.0.1:{server.port}?rank=1&world_size=2", timeout=TIMEOUT))
    assert restarted.check(["rank_0_address"])  # torch's: the stale address is there at once


def test_each_restart_reads_only_its_own_keys():
    server = agent_store()
    first = process_group_store("127.0.0.1", server.port, TIMEOUT, environment(0))
    first.set("rank_0_address", "the first incarnation's port")
    restarted = process_group_store("127.0.0.1", server.port, TIMEOUT, environment(1))
    assert not restarted.check(["rank_0_address"])
    restarted.set("rank_0_address", "the restart's port")
    assert first.get("rank_0_address") == b"the first incarnation's port"
    assert process_group_store("127.0.0.1", server.port, TIMEOUT, environment(1)).get("rank_0_address") == \
        b"the restart's port"


def test_without_torchruns_agent_store_init_method_serves():
    assert attempt_prefix({}) is None and attempt_prefix({"TORCHELASTIC_USE_AGENT_STORE": "False"}) is None
    assert process_group_store("127.0.0.1", 1, TIMEOUT, {"RANK": "0"}) is None
    assert attempt_prefix(environment(2)) == "/worker/attempt_2"
