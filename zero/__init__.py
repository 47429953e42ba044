"""ZeRO-powered data parallelism (stages 1-3) and ZeRO-R, plus `zero.comm`, the one door through which
every collective in the repo passes (and is counted)."""
