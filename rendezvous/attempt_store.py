"""The rendezvous store a process group is built on, one key space per torchrun restart.

Under torchrun the agent serves the store (TORCHELASTIC_USE_AGENT_STORE=True) and, with its default static
rendezvous (`--nnodes N --master_addr A --master_port P`, how Megatron-LM's scripts launch), keeps that one
store for the whole job: torch/distributed/elastic/rendezvous/static_tcp_rendezvous.py,
`StaticTCPRendezvous.next_rendezvous` creates its TCPStore once (`if not self._store`) and hands the same one
to every restart. torch 2.13's `init_process_group` then connects to it without any per-attempt prefix
(torch/distributed/rendezvous.py, `_create_c10d_store`: "We create a new TCPStore for every retry so no need
to add prefix for each attempt" -- true of the c10d rendezvous, which gives each round a new store, not of
the static one). So a restarted rank read the previous incarnation's gloo addresses, still in the store, and
gloo's connectFullMesh failed with "Connection refused" on every restart (issue 69).

Older torch put each attempt under `/worker/attempt_{TORCHELASTIC_RESTART_COUNT}` (the same function before
2.4), which is what this module does again: every group of the job (the default one, the mesh's, new_group's)
derives its keys from the default group's store, so one prefix here separates whole incarnations. The c10d
rendezvous's fresh store is unaffected (an empty store with a prefix is as empty)."""

from __future__ import annotations

from datetime import timedelta
from typing import Mapping, Optional

import torch.distributed as dist


def attempt_prefix(environ: Mapping[str, str]) -> Optional[str]:
    """The key prefix of this incarnation on the agent's store; None when no torchrun agent serves the store
    (a plain launch, SLURM: rank 0 hosts a new store each time)."""
    if environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    return f"/worker/attempt_{environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def process_group_store(master_addr: str, master_port: int, timeout: timedelta,
                        environ: Mapping[str, str]) -> Optional[dist.Store]:
    """A client of the agent's store under this incarnation's prefix, for `init_process_group(store=...)`;
    None where `init_method` serves (no agent store)."""
    prefix = attempt_prefix(environ)
    if prefix is None:
        return None
    client = dist.TCPStore(master_addr, master_port, is_master=False, timeout=timeout)
    return dist.PrefixStore(prefix, client)
