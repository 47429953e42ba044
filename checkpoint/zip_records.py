"""Is a torch.save archive intact: its zip directory readable and every record's CRC-32 matching. torch.load does not
check the CRC, so every reader of a torch file here asks this first.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import Optional, Union


def zip_damage(source: Union[Path, bytes, memoryview], check_content: bool = True) -> Optional[str]:
    """What is wrong with the archive at `source` (a file or its bytes), or None; without `check_content` only the
    directory is read."""
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
