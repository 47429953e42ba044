"""The run's settings: PretrainConfig composes the sections each package owns (the model's, the optimizer's, the
data's, ZeRO's, ...) and checks the rules that span sections. Every setting is a flag and a YAML key of one name;
the parser and the translations fill a flat draft {setting: value} that `from_flat` freezes once."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Optional

from arguments.bounds import check_bounds
from arguments.checkpoint_config import TORCH_DIST, CheckpointConfig
from arguments.config_sources import FLAG
from arguments.cuda_graphs import check_cuda_graphs
from arguments.logging_config import LoggingConfig
from arguments.megatron.beyond_megatron import settings_beyond_megatron
from arguments.megatron.defaults import DEFAULT_SOURCES
from arguments.megatron.harvested_flags import harvested
from arguments.step_batch_schedule import parse_step_schedule
from arguments.training_config import TrainingConfig
from arguments.upcycling_rules import check_upcycling
from base.errors import ConfigError
from base.options import flag_of, option_fields, setting_names, setting_values, with_settings
from data.data_config import DataConfig
from gpt.hybrid_pattern import ATTENTION, MLA
from gpt.layer_spec import mixer_symbols
from gpt.model_config import ModelConfig
from parallel.config import ParallelismConfig, recorded_section
from zero.config import ActivationCheckpointConfig, ZeroConfig
from zero.optimizer_config import OptimizerConfig


@dataclass(frozen=True)
class PretrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    parallel: ParallelismConfig = field(default_factory=ParallelismConfig)
    data: DataConfig = field(default_factory=DataConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    zero: ZeroConfig = field(default_factory=ZeroConfig)
    activations: ActivationCheckpointConfig = field(default_factory=ActivationCheckpointConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)

    # Where each setting's value came from (arguments/config_sources.py): filled in by arguments.parser, empty
    # for a config built in code. Not a setting: to_dict and comparisons leave it out.
    sources: dict = field(default_factory=dict, compare=False, repr=False)
    # The DeepSpeed JSON's own batch keys as written ({"source": file, "train_batch_size": n, ...}):
    # DeepSpeed checks them against the data-parallel size at initialize, and so does
    # arguments/batch_schedule.py, whichever values the command line made the run use. Not a setting.
    deepspeed_batch: dict = field(default_factory=dict, compare=False, repr=False)
    # One line per DeepSpeed JSON optimizer or scheduler value the run does not use (arguments/deepspeed/
    # differences.py), said last before the first iteration. Not a setting.
    json_differences: tuple = field(default=(), compare=False, repr=False)

    SECTIONS = ("model", "optimizer", "training", "parallel", "data", "logging", "zero", "activations", "checkpoint")

    def _check_pipeline(self) -> None:
        """What pipeline stages (training/pipeline_step.py) cannot run yet, refused in one line each."""
        if self.parallel.pipeline_model_parallel_size == 1:
            self._check_one_stage()
        else:
            self._check_stages()

    def _check_one_stage(self) -> None:
        """The split flags of several stages, given to one."""
        from gpt.pipeline_layout import pipeline_layout_counts

        parallel = self.parallel
        for flag, value in (("--num-layers-per-virtual-pipeline-stage", parallel.num_layers_per_virtual_pipeline_stage),
                            ("--num-virtual-stages-per-pipeline-rank", parallel.num_virtual_stages_per_pipeline_rank)):
            if value is not None:
                raise ConfigError(f"{flag} needs --pipeline-model-parallel-size > 1 (Megatron refuses it without "
                                  f"stages too): drop it, or add stages",
                                  flags=(flag, "--pipeline-model-parallel-size"))
        if (parallel.decoder_first_pipeline_num_layers, parallel.decoder_last_pipeline_num_layers) != (None, None):
            raise ConfigError("--decoder-first/last-pipeline-num-layers need --pipeline-model-parallel-size > 1 (the "
                              "sizes of the first and last of several stages): drop them, or add stages",
                              flags=("--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
                                     "--pipeline-model-parallel-size"))
        if parallel.pipeline_model_parallel_layout is not None:
            counts = pipeline_layout_counts(self.model, parallel)  # its own checks hold for one stage too
            if len(counts[0]) > 1:
                raise ConfigError(f"--pipeline-model-parallel-layout {parallel.pipeline_model_parallel_layout!r} has "
                                  f"{len(counts[0])} virtual stages on one pipeline stage: interleaving needs "
                                  f"--pipeline-model-parallel-size > 1; use one virtual stage, or add stages",
                                  flags=("--pipeline-model-parallel-layout", "--pipeline-model-parallel-size"))

    def _check_stages(self) -> None:
        """Several stages: the layout or the split flags (each stage with a layer), and ZeRO's stage."""
        from gpt.pipeline_layout import pipeline_layout_counts
        from gpt.stage_layers import stage_layers  # the split's own checks name the flags

        pp, parallel = self.parallel.pipeline_model_parallel_size, self.parallel
        if parallel.pipeline_model_parallel_layout is not None:
            # Megatron-LM's validate_args: the layout replaces the split flags
            given = [flag for flag, value in (
                ("--num-layers-per-virtual-pipeline-stage", parallel.num_layers_per_virtual_pipeline_stage),
                ("--num-virtual-stages-per-pipeline-rank", parallel.num_virtual_stages_per_pipeline_rank),
                ("--decoder-first-pipeline-num-layers", parallel.decoder_first_pipeline_num_layers),
                ("--decoder-last-pipeline-num-layers", parallel.decoder_last_pipeline_num_layers),
                ("--account-for-embedding-in-pipeline-split", parallel.account_for_embedding_in_pipeline_split),
                ("--account-for-loss-in-pipeline-split", parallel.account_for_loss_in_pipeline_split))
                if value not in (None, False)]
            if given:
                raise ConfigError(f"--pipeline-model-parallel-layout with {', '.join(given)}: the layout gives the "
                                  f"split itself; drop {'them' if len(given) > 1 else 'it'}",
                                  flags=("--pipeline-model-parallel-layout", *given))
            pipeline_layout_counts(self.model, parallel)  # refuses what it cannot map, in one line
        uneven = (parallel.decoder_first_pipeline_num_layers, parallel.decoder_last_pipeline_num_layers)
        split = dict(virtual_stages=parallel.num_virtual_stages_per_pipeline_rank,
                     account_for_embedding=parallel.account_for_embedding_in_pipeline_split,
                     account_for_loss=parallel.account_for_loss_in_pipeline_split)
        for rank in range(pp):  # a stage left without a layer is refused by its own rank's split
            stage_layers(self.model.num_layers, pp, rank, parallel.num_layers_per_virtual_pipeline_stage, *uneven,
                         **split, layout_counts=pipeline_layout_counts(self.model, parallel))
        if self.zero.stage == 3:
            # DeepSpeed's pipeline engine asserts zero_optimization_stage() < ZeroStageEnum.gradients
            # (deepspeed/runtime/pipe/engine.py: "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism").
            # Here stage 2 runs too (its reducer reduces every micro-batch on the stage's DP group, as Megatron-Core's
            # distributed optimizer with PP reduce-scatters); stage 3's per-block gathers are not wired to stages.
            raise ConfigError(f"--zero-stage 3 with --pipeline-model-parallel-size {pp}: ZeRO-3 is incompatible "
                              f"with pipeline parallelism (as in DeepSpeed); use --zero-stage 1 or 2",
                              flags=("--zero-stage", "--pipeline-model-parallel-size"))

    def megatron_format_unwritten(self) -> Optional[str]:
        """Why --save cannot write Megatron-LM's torch_dist layout for this run (checkpoint/torch_dist/writer.py), in
        one start line; None where it can or is not asked. Such a run is accepted, as Megatron-LM launches give the
        flag beside these settings, and saves this project's format: the format changes no math."""
        if self.checkpoint.ckpt_format != TORCH_DIST or not self.checkpoint.save:
            return None
        model, experts = self.model, self._unwritten_experts()
        beyond = settings_beyond_megatron(model, harvested()["flags"], DEFAULT_SOURCES)
        unwritten = [what for what, on in (
            *((f"{flag} (Megatron-LM has no such flag)", True) for flag in beyond),
            (experts, experts is not None),
            # gpt/mla.py norms the hidden state before linear_q_proj there; Megatron-Core 0.16.1 builds no such norm
            ("multi-latent attention's query norm without --q-lora-rank (Megatron-Core builds none)",
             model.mla.multi_latent_attention and model.attention.qk_layernorm and model.mla.q_lora_rank is None),
            # a pattern's save is HybridModel's layout (checkpoint/torch_dist/names.py hybrid_megatron_placement),
            # whose `+` layers (hybrid_layer_specs.py mla_layer: q_layernorm and kv_layernorm IdentityOp) hold no
            # latent norms
            ("multi-latent attention's latent norms (--qk-layernorm) under --hybrid-layer-pattern (HybridModel's "
             "MLA layers build none)", model.mla.multi_latent_attention and bool(model.hybrid_layer_pattern)
             and model.attention.qk_layernorm),
            # MoE MTP layers are written in GPTModel's layout (an MTP transformer layer's experts, router and expert
            # bias); HybridModel's MTP depths holding experts were never continued by Megatron-LM
            ("an MoE multi-token prediction depth under --hybrid-layer-pattern",
             bool(model.hybrid_layer_pattern) and bool(model.mtp.num_layers) and model.moe is not None),
            # names.py places the GPT path's Gated DeltaNet decoder layers, not its MTP layers' (nor their spec)
            ("multi-token prediction beside --experimental-attention-variant gated_delta_net",
             model.hybrid_layer_pattern is None and bool(model.mtp.num_layers) and model.gdn.gated_delta_net),
            (f"--optimizer {self.optimizer.optimizer}'s states", self.optimizer.optimizer != "adam"),
            ("--keep-last's pruning", bool(self.checkpoint.keep_last))) if on]
        if not unwritten:
            return None
        return (f"> --ckpt-format {TORCH_DIST}: {', '.join(unwritten)}: not written in Megatron-LM's layout "
                f"here; --save writes this project's checkpoints")

    def _unwritten_experts(self) -> Optional[str]:
        """What of the MoE layers checkpoint/torch_dist/writer.py does not write in Megatron-Core's layout: it
        writes SequentialMLP's (layer, expert) tensors, the shared expert's (and its gate), the router's weight, bias
        and expert bias, and dense layers between (--moe-layer-freq): MoE layers of one expert count under
        Megatron-Core's router, without the state its writer does not hold."""
        model = self.model
        if model.moe is None:
            return None
        experts = model.experts
        if experts.deepspeed.gating == "deepspeed":
            return "DeepSpeed-MoE's layers"
        if len(set(count for count in model.experts_per_layer() if count > 1)) > 1:
            return "MoE layers of different expert counts"
        if experts.shared_expert_intermediate_size and model.add_bias_linear:
            # Megatron-Core's SharedExpertMLP asserts "bias is not supported in the shared experts"
            return "the shared experts' biases (Megatron-Core builds none)"
        return None

    def _check_multi_token_prediction(self) -> None:
        """What --mtp-num-layers (gpt/mtp.py) does not run yet, one line each."""
        mtp = self.model.mtp.num_layers
        if not mtp:
            return
        pp = self.parallel.pipeline_model_parallel_size
        if pp > 1 and self.model.positions.position_embedding_type == "learned_absolute":
            raise ConfigError(f"--mtp-num-layers {mtp} with --pipeline-model-parallel-size {pp} and learned absolute "
                              f"positions is not implemented here: the last stage's MTP layers hold no position "
                              f"embedding; use --position-embedding-type rope or none, or one stage",
                              flags=("--mtp-num-layers", "--pipeline-model-parallel-size", "--position-embedding-type"))
        if self.logging.moe_per_layer_logging and self.model.moe is not None:
            raise ConfigError("--moe-per-layer-logging with --mtp-num-layers is not implemented here: drop "
                              "--moe-per-layer-logging", flags=("--moe-per-layer-logging", "--mtp-num-layers"))

    def _check_context_parallel(self) -> None:
        """What context parallelism (parallel/context_parallel.py) needs and what it does not run, one line each."""
        cp, model = self.parallel.context_parallel_size, self.model
        if cp == 1:
            return
        self._check_context_parallel_exchange(cp)
        tp = self.parallel.tensor_model_parallel_size
        local = model.seq_length // cp
        if model.seq_length % (2 * cp):
            raise ConfigError(f"--seq-length {model.seq_length} must be divisible by 2 x --context-parallel-size "
                              f"({2 * cp}): each rank holds two equal chunks of the sequence",
                              flags=("--seq-length", "--context-parallel-size"))
        if self.parallel.sequence_parallel and tp > 1 and local % tp:
            raise ConfigError(f"--sequence-parallel splits each context-parallel rank's {local} tokens over "
                              f"--tensor-model-parallel-size {tp}: choose --seq-length divisible by CP x TP",
                              flags=("--sequence-parallel", "--seq-length", "--context-parallel-size"))
        # document masking (--reset-position-ids, --reset-attention-mask, --eod-mask-loss, --goldfish-loss) runs
        # under context parallelism: the whole sample's masks split with the tokens (data/documents_cp.py), as
        # Megatron-LM's get_batch_on_this_cp_rank splits them, which asserts nothing about them
        if self.zero.distributed_optimizer_instances > 1:
            raise ConfigError("--num-distributed-optimizer-instances > 1 with --context-parallel-size is not "
                              "implemented here: use one optimizer instance",
                              flags=("--context-parallel-size", "--num-distributed-optimizer-instances"))

    def _check_context_parallel_exchange(self, cp: int) -> None:
        """What --cp-comm-type's exchange does not compute, or needs of the heads."""
        model = self.model
        comm = model.attention.cp_comm_type
        # the ring takes the scores' scale (--softmax-scale, multi-latent attention's) but not their soft-capping
        if comm in ("p2p", "a2a+p2p") and model.attention.attn_logit_softcapping:
            raise ConfigError(f"--attn-logit-softcapping with --cp-comm-type {comm} (the ring) is not implemented: the "
                              f"ring does not soft-cap its scores; use --cp-comm-type all_gather or a2a with "
                              f"--context-parallel-size {cp}", flags=("--attn-logit-softcapping", "--cp-comm-type"))
        if comm in ("p2p", "a2a+p2p") and model.has_windows():
            # the ring's blocks other than a rank's own are half visible and unmasked (gpt/cp_attention.py); Transformer
            # Engine too runs sliding windows under context parallelism only with all_gather or a2a
            raise ConfigError(f"--window-size with --cp-comm-type {comm} (the ring) is not implemented: the ring "
                              f"computes plain causal attention; use --cp-comm-type all_gather or a2a with "
                              f"--context-parallel-size {cp}", flags=("--window-size", "--cp-comm-type"))
        tp = self.parallel.tensor_model_parallel_size
        heads = model.num_attention_heads // tp
        if comm == "a2a+p2p":  # each layer's key heads: multi-latent attention's are its query heads (gpt/mla.py)
            key_heads = {MLA: model.num_attention_heads,
                         ATTENTION: model.attention.num_query_groups or model.num_attention_heads}
            for groups in sorted({key_heads[mixer] for mixer in mixer_symbols(model)}):
                # (fewer groups than TP ranks: each rank reads one, gpt/qkv_projection.py QKVLayout)
                self._check_hierarchical_context_parallel(heads, max(groups // tp, 1))
        if model.attention.cp_comm_type == "a2a" and heads % cp:
            # DeepSpeed's single_all_to_all asserts it: "Number of heads must be divisible by the sequence parallel
            # size"; Megatron-DeepSpeed's ParallelAttention too (num_attention_heads % sequence parallel size).
            raise ConfigError(f"--cp-comm-type a2a (DeepSpeed-Ulysses) splits each tensor-parallel rank's {heads} "
                              f"attention heads over {cp} ranks: choose --num-attention-heads divisible by TP x "
                              f"{cp}", flags=("--num-attention-heads", "--context-parallel-size",
                                              "--ds-sequence-parallel-size"))

    def _check_hierarchical_context_parallel(self, heads: int, groups: int) -> None:
        """--cp-comm-type a2a+p2p: Megatron-LM's validate_args asserts --hierarchical-context-parallel-sizes is given,
        TransformerEngine (attn_forward_func_with_cp) takes two levels, and its flash_attn_a2a_communicate splits a
        TP rank's query and key/value heads over the all-to-all level."""
        levels = self.parallel.hierarchical_context_parallel_sizes
        if not levels or len(levels) != 2:
            raise ConfigError("--cp-comm-type a2a+p2p needs --hierarchical-context-parallel-sizes A B (two sizes: the "
                              "all-to-all over A adjacent CP ranks, the ring over B), as Megatron-LM asserts",
                              flags=("--cp-comm-type", "--hierarchical-context-parallel-sizes"))
        if heads % levels[0] or groups % levels[0]:
            raise ConfigError(f"--cp-comm-type a2a+p2p splits each tensor-parallel rank's {heads} attention heads and "
                              f"{groups} key/value groups over the all-to-all level's {levels[0]} ranks: choose "
                              f"--num-attention-heads and --num-query-groups divisible by TP x {levels[0]}",
                              flags=("--num-attention-heads", "--num-query-groups",
                                     "--hierarchical-context-parallel-sizes"))

    def _check_expert_parallel(self) -> None:
        """--expert-model-parallel-size splits each MoE layer's experts evenly over its ranks (Megatron-LM's
        validate_args: `args.num_experts % args.expert_model_parallel_size == 0`); the data-parallel size it
        must divide is known at launch (parallel/mesh.py expert_mesh_sizes)."""
        ep = self.parallel.expert_model_parallel_size
        if ep == 1:
            return
        flag = "--expert-model-parallel-size"
        if self.model.moe is None:
            raise ConfigError(f"{flag} {ep} needs experts to split: add --num-experts (a multiple of {ep})",
                              flags=(flag, "--num-experts"))
        # each MoE layer's count (a Megatron-DeepSpeed list gives each its own) over the same group: DeepSpeed-MoE's
        # MoE asserts `num_experts % ep_size == 0` per layer (deepspeed/moe/layer.py)
        counts = sorted(set(self.model.experts.distinct_counts(self.model.num_layers)) | {self.model.moe.num_experts})
        indivisible = [count for count in counts if count % ep != 0]
        if indivisible:
            raise ConfigError(f"--num-experts {' '.join(map(str, indivisible))} is not divisible by {flag} {ep}; each "
                              f"expert-parallel rank holds an equal share of every MoE layer's experts",
                              flags=(flag, "--num-experts"))
        # --num-distributed-optimizer-instances also cuts the experts' optimizer over the expert data-parallel group
        # (parallel/state.py); that it divides the expert DP size is checked at launch, where the size is known

    def split_unread_note(self) -> Optional[str]:
        """--split typed beside per-split blends: not read, each split's blend is read whole (data/per_split.py). A
        default --split, ours or a Megatron generation's, is not read there either and needs no line."""
        source = self.sources.get("split")
        if source is None or source.kind != FLAG or self.data.sources().per_split is None:
            return None
        return (f"> --split {self.data.split} beside per-split blends: not read, each split's blend is read whole "
                f"(Megatron-Core since 2024-01 asserts 'split and blend_per_split are incompatible'; LLM360's K2-V2 "
                f"launches give both)")

    def _check_flex_dispatcher(self) -> None:
        """Megatron-Core's flex dispatcher beside the experts (token_dispatcher.py MoEFlexTokenDispatcher and
        transformer_config.py at d98e8a64): DeepEP and NCCL-EP assert an expert TP x EP group of more than one
        rank, and DeepEP refuses --moe-pad-expert-input-to-capacity."""
        parallel, moe = self.parallel, self.model.moe
        if parallel.moe_token_dispatcher_type != "flex" or moe is None:
            return
        backend = parallel.flex_backend
        etp = parallel.expert_tensor_parallel_size or parallel.tensor_model_parallel_size
        group = etp * parallel.expert_model_parallel_size
        if backend in ("deepep", "ncclep") and group == 1:
            name = "DeepEP" if backend == "deepep" else "NCCL EP"
            raise ConfigError(f"--moe-token-dispatcher-type flex with the {backend} backend needs more than one rank "
                              f"in the expert tensor-parallel x expert-parallel group ({name} dispatcher requires "
                              f"TPxEP > 1, as Megatron-Core asserts): raise --expert-model-parallel-size, or use "
                              f"--moe-token-dispatcher-type alltoall",
                              flags=("--moe-token-dispatcher-type", "--moe-flex-dispatcher-backend",
                                     "--expert-model-parallel-size"))
        if backend == "deepep" and moe.pad_expert_input_to_capacity:
            raise ConfigError("--moe-pad-expert-input-to-capacity with the flex dispatcher's deepep backend: "
                              "Megatron-Core refuses it (DeepEP does not pad to capacity); use "
                              "--moe-flex-dispatcher-backend hybridep or --moe-token-dispatcher-type alltoall",
                              flags=("--moe-pad-expert-input-to-capacity", "--moe-flex-dispatcher-backend"))

    def _check_moe_tensor_parallel(self) -> None:
        """MoE under tensor parallelism (gpt/moe/layer.py): Megatron-Core's MoELayer.forward raises in training
        with TP > 1 and no sequence parallelism; each expert's ffn splits evenly over the expert TP ranks
        (--expert-tensor-parallel-size, default TP as Megatron-LM's validate_args; any size whose grid divides the
        ranks, parallel/mesh.py, TP 1 included)."""
        tp = self.parallel.tensor_model_parallel_size
        moe = self.model.moe
        if moe is None:
            return
        etp = self.parallel.expert_tensor_parallel_size
        etp = tp if etp is None else etp
        flags = ("--num-experts", "--tensor-model-parallel-size")
        if tp > 1 and not self.parallel.sequence_parallel:
            raise ConfigError(f"--num-experts with --tensor-model-parallel-size {tp} needs --sequence-parallel "
                              f"(Megatron-Core's MoE layer refuses tensor parallelism without it in training): add "
                              f"--sequence-parallel", flags=(*flags, "--sequence-parallel"))
        if tp > 1 and moe.deepspeed.gating == "deepspeed":
            raise ConfigError(f"DeepSpeed-MoE's gating (Megatron-DeepSpeed's MoE flags) with "
                              f"--tensor-model-parallel-size {tp} is not implemented here: use Megatron-Core's "
                              f"--moe-* flags, or --tensor-model-parallel-size 1", flags=flags)
        if self.model.mlp.activation == "xielu" and max(tp, etp) > 1:
            # each expert's two xIELU scalars would need their gradient summed over the expert-TP peers (and the
            # tensor-parallel shared experts' over TP), which the experts here do not do
            raise ConfigError(f"--xielu with --num-experts and --tensor-model-parallel-size {tp} / "
                              f"--expert-tensor-parallel-size {etp} is not implemented: the experts' xIELU scalars "
                              f"are not tensor-parallel here; run it at --tensor-model-parallel-size 1 and "
                              f"--expert-tensor-parallel-size 1",
                              flags=("--xielu", *flags, "--expert-tensor-parallel-size"))
        shared = moe.shared_expert_intermediate_size
        if tp > 1 and shared is not None and shared % tp:
            raise ConfigError(f"--moe-shared-expert-intermediate-size {shared} is not divisible by "
                              f"--tensor-model-parallel-size {tp}: the shared experts split over the TP ranks",
                              flags=("--moe-shared-expert-intermediate-size", "--tensor-model-parallel-size"))
        if moe.ffn_hidden_size % etp:
            raise ConfigError(f"--moe-ffn-hidden-size {moe.ffn_hidden_size} is not divisible by "
                              f"--expert-tensor-parallel-size {etp} (the default: --tensor-model-parallel-size); "
                              f"each expert's ffn splits evenly over the expert tensor-parallel ranks",
                              flags=("--moe-ffn-hidden-size", "--expert-tensor-parallel-size"))

    def validate(self) -> None:
        self._check_finite_numbers()
        for section in self.SECTIONS:
            getattr(self, section).validate()
        tp = self.parallel.tensor_model_parallel_size
        self.model.validate_tensor_parallel(tp)
        if self.parallel.sequence_parallel and self.model.seq_length % tp != 0:
            raise ConfigError(f"--sequence-parallel splits the sequence over the tensor-parallel ranks: --seq-length "
                              f"{self.model.seq_length} is not divisible by --tensor-model-parallel-size {tp}; "
                              f"choose a multiple of it",
                              flags=("--sequence-parallel", "--seq-length", "--tensor-model-parallel-size"))
        self._check_goldfish()
        check_upcycling(self)
        self._check_muon()
        self._check_expert_parallel()
        self._check_flex_dispatcher()
        self._check_moe_tensor_parallel()
        self._check_pipeline()
        self._check_context_parallel()
        self._check_multi_token_prediction()
        self._check_hf_model_type()
        check_cuda_graphs(self)
        self.activations.validate_for_layers(self.model.num_layers)
        if self.training.step_batch_size_schedule is not None:
            self._check_step_schedule()
        if self.data.tokenizer_type == "NullTokenizer" and self.model.vocab_size < 1:
            # Megatron-LM asserts the flag (tokenizer.py: `assert args.vocab_size is not None`); given as 0 its
            # NullTokenizer has the end-of-document id alone (N + 1 ids) and the data's ids land in padding rows
            typed = f", got {self.model.vocab_size}: 0 leaves only the end-of-document id, every other token id " \
                    f"would fall in the padding rows" if self.sources["vocab_size"].kind == FLAG else ""
            raise ConfigError(f"--tokenizer-type NullTokenizer needs --vocab-size N (token ids 0..N-1; the "
                              f"end-of-document id is N){typed}", flags=("--tokenizer-type", "--vocab-size"))
        check_bounds(self)  # last: the estimates read values the rules above have made sane

    def _check_finite_numbers(self) -> None:
        """Every float setting must be a finite number. NaN compares false with everything, so the range
        checks alone would let `--lr nan` or `--clip-grad nan` through (and a NaN clip disables clipping);
        inf would train to NaN weights. Run first, so the range checks compare real numbers."""
        for section in self.SECTIONS:
            for name, value in setting_values(getattr(self, section)).items():
                if isinstance(value, float) and not math.isfinite(value):
                    raise ConfigError(f"{_flag(name)} must be a finite number, got {value}", flags=(_flag(name),))

    def _check_hf_model_type(self) -> None:
        """--hf-model-type names a family the Hugging Face folders are read and written as (arguments/hf_config.py)."""
        from arguments.hf_config import families

        wanted, known = self.model.hf_model_type, families()
        if wanted is not None and wanted not in known:
            raise ConfigError(f"--hf-model-type {wanted} is not a family read or written here: one of "
                              f"{', '.join(known)}", flags=("--hf-model-type",))

    def _check_muon(self) -> None:
        """Muon's Newton-Schulz needs each whole matrix: zero/muon.py gathers it over the ZeRO partition and, per
        --muon-tp-mode, over TP (an expert's over expert TP); the host step of --offload-optimizer (PyTorch's fused
        AdamW) is not built for it."""
        if self.optimizer.optimizer != "muon":
            return
        if self.zero.offload_optimizer:
            raise ConfigError("--optimizer muon steps on the training device: --offload-optimizer's host step is "
                              "AdamW's only", flags=("--optimizer", "--offload-optimizer"))
        if self.optimizer.algorithms.exp_avg_dtype != "fp32" or self.optimizer.algorithms.exp_avg_sq_dtype != "fp32":
            raise ConfigError("--optimizer muon keeps fp32 states: bf16 moments are Adam's only",
                              flags=("--optimizer", "--exp-avg-dtype"))
        model, tp = self.model, self.parallel.tensor_model_parallel_size
        groups = model.attention.query_groups(model.num_attention_heads)
        if self.optimizer.algorithms.muon_split_qkv and ATTENTION in mixer_symbols(model) and groups < tp:
            # a TP rank's QKV rows are then part of one group's, which Megatron-Core's muon.py also cannot split
            raise ConfigError(f"--optimizer muon splits the QKV weight by query group, which --num-query-groups "
                              f"{groups} below --tensor-model-parallel-size {tp} cuts over the TP ranks: not "
                              f"implemented; add --muon-no-split-qkv",
                              flags=("--optimizer", "--num-query-groups", "--tensor-model-parallel-size"))

    def _check_goldfish(self) -> None:
        """swiss-ai's fork asserts K and H positive (arguments.py: "goldfish_k (frequency) must be a positive
        integer", "goldfish_h (context width) must be a positive integer"), and its apply_goldfish hashes windows of
        H labels of a sample (`labels.unfold(0, goldfish_context_width, 1)`, which fails on a shorter sample)."""
        data = self.data
        if not data.goldfish_loss:
            return
        for flag, value in (("--goldfish-k", data.goldfish_k), ("--goldfish-h", data.goldfish_h)):
            if value < 1:
                raise ConfigError(f"{flag} must be a positive integer, got {value}", flags=(flag, "--goldfish-loss"))
        if data.goldfish_h > self.model.seq_length:
            raise ConfigError(f"--goldfish-h {data.goldfish_h} is longer than a sample's {self.model.seq_length} "
                              f"labels (--seq-length): the goldfish loss hashes windows of --goldfish-h labels "
                              f"within a sample; choose at most --seq-length",
                              flags=("--goldfish-h", "--seq-length"))

    def _check_step_schedule(self) -> None:
        """What needs no grid: the schedule parses, and no other setting also sets the batch per iteration
        (--global-batch-size beside it is refused in batch_schedule, which knows where values came from)."""
        training = self.training
        parse_step_schedule(training.step_batch_size_schedule, self.model.seq_length)
        if training.rampup_batch_size is not None:
            raise ConfigError("--step-batch-size-schedule and --rampup-batch-size both set the global batch of each "
                              "iteration; keep one (Megatron-LM's main branch ignores --rampup-batch-size)",
                              flags=("--step-batch-size-schedule", "--rampup-batch-size"))
        if training.accumulation_steps is not None:
            raise ConfigError("--step-batch-size-schedule sets the accumulation steps of each iteration; drop "
                              "--gradient-accumulation-steps",
                              flags=("--step-batch-size-schedule", "--gradient-accumulation-steps"))

    def to_dict(self) -> dict:
        """{section: {setting: value}} as checkpoint metadata and the run's logs record it: the `parallel`
        section's settings under the sections that held them before it (parallel/config.py
        `RECORDED_SECTION`), so a checkpoint's recorded config reads the same either side of the move."""
        record: dict = {section: {} for section in self.SECTIONS if section != "parallel"}
        for section in self.SECTIONS:
            for name, value in setting_values(getattr(self, section)).items():
                shown = recorded_section(name) if section == "parallel" else section
                record[shown][name] = value
        return record

    @classmethod
    def from_flat(cls, values: dict, sources: Optional[dict] = None, deepspeed_batch: Optional[dict] = None,
                  json_differences: tuple = ()) -> "PretrainConfig":
        """Build from a flat {field_name: value} mapping (what argparse and YAML presets give): each section
        constructed once from its values, the defaults for the rest."""
        sections = field_sections()
        by_section: dict[str, dict] = {section: {} for section in cls.SECTIONS}
        for name, value in values.items():
            if name not in sections:
                raise ConfigError(f"unknown setting {name!r}")
            by_section[sections[name]][name] = value
        kinds = {f.name: f.default_factory for f in fields(cls) if f.name in cls.SECTIONS}
        return cls(sources=dict(sources or {}), deepspeed_batch=dict(deepspeed_batch or {}),
                   json_differences=tuple(json_differences),
                   **{section: with_settings(kinds[section], given) for section, given in by_section.items()})


def field_sections() -> dict[str, str]:
    """Every setting name -> the section it lives in."""
    config = PretrainConfig()
    return {name: section for section in PretrainConfig.SECTIONS for name in setting_names(type(getattr(config, section)))}


def _flag(name: str) -> str:
    """The flag of a setting, in any section (`--zero-stage` for `stage`)."""
    return FLAG_NAMES[name]


def _flag_names() -> dict[str, str]:
    config = PretrainConfig()
    return {f.name: flag_of(f) for section in config.SECTIONS for f, _ in option_fields(type(getattr(config, section)))}


# Every setting -> its flag (`option(flags=...)` on the field, else `--field-name`).
FLAG_NAMES = _flag_names()
