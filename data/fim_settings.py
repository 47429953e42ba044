"""Fill-in-the-middle's settings (data/fim.py, Megatron-LM's GPTFIMDataset): a section of DataConfig
(data/data_config.py), with --fim-data's checks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

from base.errors import ConfigError
from base.options import option


@dataclass(frozen=True)
class FIMSettings:
    SETTING_PREFIX: ClassVar[str] = ""

    fim_data: bool = option(False, help="fill-in-the-middle samples, as Megatron-LM's GPTFIMDataset: each piece "
                                        "between end-of-document tokens is, with probability --fim-rate, cut into "
                                        "prefix, middle and suffix and put in SPM or PSM order")
    fim_rate: float = option(0.5, help="with --fim-data: probability that a piece becomes a FIM example")
    fim_spm_rate: float = option(0.5, help="with --fim-data: probability that a FIM example is SPM, not PSM")
    fim_split_sample: Optional[str] = option(None, help="with --fim-data: a token that splits pieces into "
                                                       "fragments, each permuted with --fim-fragment-rate")
    fim_fragment_rate: Optional[float] = option(None, help="with --fim-split-sample: each fragment's FIM rate")
    fim_no_prefix: Optional[str] = option(None, help="with --fim-data: a piece whose text starts with this is "
                                                    "left as it is")
    fim_prefix_token: str = option("<fim_prefix>", help="FIM prefix token (a token the vocabulary lacks is its "
                                                        "unknown token: <|endoftext|> for GPT-2's files)")
    fim_middle_token: str = option("<fim_middle>", help="FIM middle token")
    fim_suffix_token: str = option("<fim_suffix>", help="FIM suffix token")
    fim_pad_token: str = option("<fim_pad>", help="FIM pad token (fills a sample a permutation shortened)")
    fim_eod_token: str = option("<|endoftext|>", help="FIM end-of-document token: pieces are cut at it")

    def validate(self, mock_data: bool) -> None:
        """--fim-data's rates, as Megatron-LM's validate_args and GPTFIMDataset take them."""
        if not self.fim_data:
            return
        # Megatron-LM's validate_args: no mock data, --fim-rate and --fim-spm-rate set (a 0 is refused too)
        if mock_data:
            raise ConfigError("--fim-data with --mock-data: Megatron's FIM dataset does not support mock data",
                              flags=("--fim-data", "--mock-data"))
        if not self.fim_rate or not self.fim_spm_rate:
            raise ConfigError("--fim-data needs --fim-rate and --fim-spm-rate above 0 (Megatron-LM asserts both)",
                              flags=("--fim-rate", "--fim-spm-rate"))
        # each rate is a probability: Megatron-LM's GPTFIMDataset draws np_rng.binomial(1, rate), which raises
        # "p < 0, p > 1 or p is NaN" in a data-loader worker at the first sample (issue 60)
        for flag, rate in (("--fim-rate", self.fim_rate), ("--fim-spm-rate", self.fim_spm_rate),
                           ("--fim-fragment-rate", self.fim_fragment_rate)):
            if rate is not None and not 0.0 <= rate <= 1.0:
                raise ConfigError(f"{flag} must be a probability, between 0 and 1, got {rate:g}", flags=(flag,))
        if self.fim_split_sample and self.fim_fragment_rate is None:
            raise ConfigError("--fim-split-sample needs --fim-fragment-rate (each fragment's FIM rate)",
                              flags=("--fim-split-sample", "--fim-fragment-rate"))
