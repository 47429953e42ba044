"""The replay corpus of real launches (issue 22, point 7): launch scripts and DeepSpeed JSONs from public
repositories, kept as written (launch.py says how), made small by shrink.py, replayed by
tests/test_replay_corpus.py."""

from tests.replay_corpus import (
                                 bigscience,
                                 deepspeed,
                                 deepspeed_examples,
                                 forks,
                                 geniac,
                                 megatron_deepspeed,
                                 megatron_deepspeed_moe,
                                 megatron_lm,
                                 megatron_lm_functional,
                                 megatron_lm_functional_tests,
                                 megatron_moe_modelzoo,
                                 open_runs,
                                 rocm_megatron_lm,
                                 round6,
                                 slime,
                                 zyphra,
)

CORPUS = (*megatron_lm.LAUNCHES, *megatron_deepspeed.LAUNCHES, *megatron_deepspeed_moe.LAUNCHES,
          *deepspeed_examples.LAUNCHES, *deepspeed.LAUNCHES,
          *bigscience.LAUNCHES, *megatron_lm_functional.LAUNCHES, *forks.LAUNCHES, *open_runs.LAUNCHES,
          *slime.LAUNCHES, *round6.LAUNCHES, *geniac.LAUNCHES,
          *zyphra.LAUNCHES, *megatron_moe_modelzoo.LAUNCHES, *rocm_megatron_lm.LAUNCHES)
# Every GPT and MoE pretraining functional test of Megatron-LM at one commit, harvested whole: counted by outcome
# in the docs, not listed there one by one (megatron_lm_functional_tests.py).
HARVESTED = (*megatron_lm_functional_tests.LAUNCHES, *megatron_lm_functional_tests.MOE_HARVESTED)
