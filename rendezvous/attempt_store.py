"""The rendezvous store a process group is built on, one key prefix per torchrun restart: torchrun's static rendezvous
keeps one store for the whole job, so without the prefix a restarted rank reads the previous incarnation's gloo
addresses."""

from __future__ import annotations

from datetime import timedelta
from typing import Mapping, Optional

import torch.distributed as dist


def attempt_prefix(environ: Mapping[str, str]) -> Optional[str]:
    """The key prefix of this incarnation on the agent's store; None without a torchrun agent store."""
    if environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    return f"/worker/attempt_{environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def process_group_store(master_addr: str, master_port: int, timeout: timedelta,
                        environ: Mapping[str, str]) -> Optional[dist.Store]:
    """A client of the agent's store under this incarnation's prefix; None where `init_method` serves."""
    prefix = attempt_prefix(environ)
    if prefix is None:
        return None
    client = dist.TCPStore(master_addr, master_port, is_master=False, timeout=timeout)
    return dist.PrefixStore(prefix, client)
