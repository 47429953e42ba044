"""The optimizer algorithms' own settings: Sophia-G's, Muon's, AdEMAMix's, and the dtypes Adam's moments are stored
in; a section of OptimizerConfig (zero/optimizer_config.py), each checked here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from base.errors import ConfigError
from base.options import Const, option

# Megatron-LM's --muon-* choices (megatron/training/arguments.py; the coefficient types are emerging_optimizers'
# NSCoeffT less "custom", which takes coefficients no flag gives)
MUON_SCALE_MODES = ("spectral", "shape_scaling", "unit_rms_norm")
MUON_COEFFICIENT_TYPES = ("quintic", "simple", "polar_express", "aol")
MUON_MATMUL_PRECISIONS = ("low", "medium", "high")
MUON_TP_MODES = ("blockwise", "duplicated", "distributed")  # zero/muon.py scaled_orthogonalize: what each does
# Megatron-LM's --exp-avg-dtype / --exp-avg-sq-dtype choices (megatron/training/arguments.py); of these fp32 and bf16
# are implemented (zero/precision_aware.py), the others refused (arguments/megatron/flags.py)
MOMENT_DTYPES = ("fp32", "fp16", "bf16", "fp8")


# --muon-num-ns-steps' bound: recipes use 5 (quintic) to 8 (polar_express) iterations
MAX_NS_STEPS = 100


@dataclass(frozen=True)
class AlgorithmSettings:
    SETTING_PREFIX: ClassVar[str] = ""

    # ALCF's Sophia-G (zero/sophia.py), its flags and their defaults (argonne-lcf/Megatron-DeepSpeed megatron/arguments.py)
    sophiag_beta1: float = option(0.9, help="with --optimizer sophiag: the momentum's decay (ALCF's fork)")
    sophiag_beta2: float = option(0.95, help="with --optimizer sophiag: the Hessian estimate's decay (ALCF's fork)")
    sophiag_rho: float = option(0.01, help="with --optimizer sophiag: the clipping threshold rho (ALCF's fork)")
    # Megatron-LM's Muon (megatron/core/optimizer/emerging_optimizers.py, TensorParallelMuon; zero/muon.py): its
    # flags and their megatron/training/arguments.py defaults (momentum 0.9 there, 0.95 in OptimizerConfig).
    muon_momentum: float = option(0.9, help="with --optimizer muon: the momentum of Muon's internal SGD (Megatron-LM)")
    muon_nesterov: bool = option(False, action="store_true",
                                 help="with --optimizer muon: Nesterov-style momentum (Megatron-LM)")
    muon_split_qkv: bool = option(True, consts=(Const(("--muon-no-split-qkv",), False),),
                                  help="with --optimizer muon: orthogonalize the fused QKV weight's query, key and "
                                       "value blocks apart (Megatron-LM's default; --muon-no-split-qkv: whole)")
    muon_scale_mode: str = option("spectral", choices=MUON_SCALE_MODES,
                                  help="with --optimizer muon: the update's shape factor, spectral sqrt(max(out, in)),"
                                       " shape_scaling sqrt(max(1, out/in)) or unit_rms_norm sqrt(out/in)")
    muon_fp32_matmul_prec: str = option("medium", choices=MUON_MATMUL_PRECISIONS,
                                        help="with --optimizer muon: medium runs Newton-Schulz in bf16, as "
                                             "emerging_optimizers does; low and high in fp32 here")
    muon_coefficient_type: str = option("quintic", choices=MUON_COEFFICIENT_TYPES,
                                        help="with --optimizer muon: the Newton-Schulz coefficients")
    muon_num_ns_steps: int = option(5, help="with --optimizer muon: Newton-Schulz iterations")
    # duplicated is Megatron-LM main's default (d98e8a64); its core_v0.16.1 defaulted to blockwise
    muon_tp_mode: str = option("duplicated", choices=MUON_TP_MODES,
                               help="with --optimizer muon and TP > 1: Newton-Schulz of each TP shard alone, scaled "
                                    "by its shape (blockwise), of the whole matrix gathered over TP on every rank "
                                    "(duplicated), or over the shards with X X^T summed over TP (distributed)")
    muon_extra_scale_factor: float = option(1.0, help="with --optimizer muon: a further factor on the update")
    muon_scalar_optimizer: str = option("adam", help="with --optimizer muon: the optimizer of embeddings, the "
                                                     "output layer, biases and norms: adam (Megatron-LM's default)")
    ademamix_alpha: float = option(5.0, help="with --optimizer ademamix: the slow momentum's weight in the update "
                                             "(swiss-ai's fork)")
    ademamix_beta3: float = option(0.999, help="with --optimizer ademamix: the slow momentum's decay (swiss-ai's fork)")
    ademamix_beta3_warmup: int = option(-1, help="with --optimizer ademamix: steps over which beta3 rises from "
                                                 "--adam-beta1 to --ademamix-beta3 by half-life (swiss-ai's fork; "
                                                 "-1: none)")
    ademamix_alpha_warmup: int = option(-1, help="with --optimizer ademamix: steps over which alpha rises linearly "
                                                 "from 0 to --ademamix-alpha (swiss-ai's fork; -1: none)")
    # Megatron-LM's precision-aware optimizer (TransformerEngine's FusedAdam): the dtype the Adam moments are stored
    # in between steps, each update computed in fp32 (zero/precision_aware.py). Only with
    # --use-precision-aware-optimizer, as in Megatron-LM; fp16 and fp8 (scaled storage) are refused.
    exp_avg_dtype: str = option("fp32", choices=MOMENT_DTYPES,
                                help="with --use-precision-aware-optimizer: the stored Adam first moment, fp32 or "
                                     "bf16 (each update computed in fp32, rounded back; Megatron-LM)")
    exp_avg_sq_dtype: str = option("fp32", choices=MOMENT_DTYPES,
                                   help="with --use-precision-aware-optimizer: the stored Adam second moment, fp32 or "
                                        "bf16 (each update computed in fp32, rounded back; Megatron-LM)")

    def validate(self, optimizer: str) -> None:
        """The chosen optimizer's knobs, as each algorithm's own constructor checks them."""
        # the fork's SophiaG.__init__ checks: betas in [0, 1), rho >= 0
        if not (0.0 <= self.sophiag_beta1 < 1.0 and 0.0 <= self.sophiag_beta2 < 1.0) or self.sophiag_rho < 0:
            raise ConfigError(f"--sophiag-beta1 and --sophiag-beta2 must be in [0, 1) and --sophiag-rho >= 0, got "
                              f"{self.sophiag_beta1}, {self.sophiag_beta2} and {self.sophiag_rho}",
                              flags=("--sophiag-beta1", "--sophiag-beta2", "--sophiag-rho"))
        if optimizer == "muon":
            self.validate_muon()
        # the fork's AdEMAMix.__init__ checks: beta3 in [0, 1), alpha >= 0
        if not 0.0 <= self.ademamix_beta3 < 1.0 or self.ademamix_alpha < 0:
            raise ConfigError(f"--ademamix-beta3 must be in [0, 1) and --ademamix-alpha >= 0, got "
                              f"{self.ademamix_beta3} and {self.ademamix_alpha}",
                              flags=("--ademamix-beta3", "--ademamix-alpha"))

    def validate_muon(self) -> None:
        """emerging_optimizers' checks (newton_schulz: a step count that fits the coefficient sets) and what is not
        built here: Lion as the scalar optimizer."""
        steps, kind = self.muon_num_ns_steps, self.muon_coefficient_type
        sets = {"quintic": 5, "aol": 4, "polar_express": 8, "simple": 1}[kind]
        if steps > MAX_NS_STEPS:  # every step is 3 matrix products a matrix: a typo would run for hours, or exhaust
            # memory building the coefficient list
            raise ConfigError(f"--muon-num-ns-steps {steps} is more than {MAX_NS_STEPS} Newton-Schulz iterations "
                              f"(Megatron-LM's default 5, polar_express 8)", flags=("--muon-num-ns-steps",))
        if steps < 1 or (kind == "polar_express" and steps < sets) or (kind in ("quintic", "aol") and steps % sets):
            raise ConfigError(f"--muon-num-ns-steps {steps} does not fit --muon-coefficient-type {kind} "
                              f"({'at least' if kind == 'polar_express' else 'a multiple of'} {sets})",
                              flags=("--muon-num-ns-steps", "--muon-coefficient-type"))
        if self.muon_scalar_optimizer != "adam":
            raise ConfigError(f"--muon-scalar-optimizer {self.muon_scalar_optimizer} is not implemented: adam "
                              f"(Megatron-LM's default)", flags=("--muon-scalar-optimizer",))
        if not 0.0 <= self.muon_momentum < 1.0:
            raise ConfigError(f"--muon-momentum must be in [0, 1), got {self.muon_momentum}", flags=("--muon-momentum",))
