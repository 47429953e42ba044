"""What torch's weights-only unpickler objected to, in one line."""

from __future__ import annotations


def unpickler_reason(error: Exception) -> str:
    """E.g. "Unsupported global: GLOBAL io.open", without the paragraph that suggests loading the file unsafely."""
    text = str(error)
    if "WeightsUnpickler error:" in text:
        reason = text.split("WeightsUnpickler error:", 1)[1].split("Check the documentation")[0]
        reason = " ".join(reason.split(" was not an allowed global")[0].split())
        if reason:
            return reason
    first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    return first.split(". This is an internal")[0]
