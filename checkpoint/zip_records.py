"""Is a torch.save archive intact: its zip directory readable and every record's bytes matching the CRC-32 stored
beside it, as Python's `zipfile` checks them.

torch.save writes a zip archive (each tensor's storage a record, with its CRC-32); torch.load does not check the
CRC, so a flipped bit inside a tensor loads as another number. Every reader of a torch file here asks this first: a
DeepSpeed .pt file (checkpoint/deepspeed/files.py), a Megatron-LM common.pt (checkpoint/torch_dist/common.py) and
each record of a torch.distributed.checkpoint `.distcp` file, which is one torch.save archive per tensor chunk or
object, back to back (checkpoint/torch_dist/dcp_reader.py).
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import Optional, Union


def zip_damage(source: Union[Path, bytes, memoryview], check_content: bool = True) -> Optional[str]:
    """What is wrong with the archive at `source` (a file, or its bytes), or None when it is intact. Without
    `check_content` only its directory is read. OSError (a missing or unreadable file) is the caller's to say."""
    opened = io.BytesIO(source) if isinstance(source, (bytes, bytearray, memoryview)) else source
    try:
        with zipfile.ZipFile(opened) as archive:
            bad = archive.testzip() if check_content else None
    except OSError:
        raise
    except Exception as error:  # noqa: BLE001 - zipfile raises BadZipFile, but also struct, zlib and value errors
        return f"truncated or corrupt, not a complete torch zip archive ({type(error).__name__}: {error})"
    if bad is not None:
        return f"corrupt, its record {bad} does not match the CRC-32 saved with it"
    return None
