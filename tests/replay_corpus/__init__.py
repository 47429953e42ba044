"""The replay corpus of real launches (issue 22, point 7): launch scripts and DeepSpeed JSONs from public
repositories, kept as written (launch.py says how), made small by shrink.py, replayed by
tests/test_replay_corpus.py."""

from tests.replay_corpus import (
                                 bigscience,
                                 deepspeed,
                                 deepspeed_examples,
                                 megatron_deepspeed,
                                 megatron_lm,
                                 megatron_lm_functional,
)

CORPUS = (*megatron_lm.LAUNCHES, *megatron_deepspeed.LAUNCHES, *deepspeed_examples.LAUNCHES, *deepspeed.LAUNCHES,
          *bigscience.LAUNCHES, *megatron_lm_functional.LAUNCHES)
