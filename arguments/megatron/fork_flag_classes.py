"""What the pretraining forks' own flags do here: llm-jp's Megatron-LM fork (branches v4 and nii-geniac, the
ones llm-jp/scripts installs), swiss-ai's Megatron-LM fork (main), Pai-Megatron-Patch (alibaba), ALCF's and LOLA's
Megatron-DeepSpeed forks, harvested into arguments/megatron/flags_harvested.json beside Megatron-LM's
(scripts/tools/harvest_megatron_flags.sh).

The flags their current pretraining scripts pass are settings here with the fork's meaning (--use-mpi,
--use-z-loss, --z-loss-strength, --wandb-name, --trigger-path, --rope-theta, --xielu, --goldfish-loss,
--goldfish-k, --goldfish-h, --optimizer ademamix and its --ademamix-* knobs: arguments/config.py,
gpt/model_config.py); the rest are classified below the way arguments/megatron/flag_classes.py classifies
Megatron-LM's, each group naming its fork. Pai-Megatron-Patch's own flags select its own tokenizers,
dataset formats and model code (megatron_patch/), which is not here: each is refused, in one line naming
the project and what it would take.
"""

from __future__ import annotations


def _names(text: str) -> tuple[str, ...]:
    return tuple(text.split())


LLM_JP = "llm-jp's Megatron-LM fork"
SWISS_AI = "swiss-ai's Megatron-LM fork"
# argonne-lcf/Megatron-DeepSpeed at ffa3456d: its pretrain_gpt_alcf.py, launched by train_alcf.sh / ALCF/helpers.sh
ALCF = "ALCF's Megatron-DeepSpeed fork"
# dice-group/LOLA at 7e8605c1: its megatron/ is a Megatron-DeepSpeed fork, launched by its lola_ws/gpt scripts
LOLA = "LOLA's Megatron-DeepSpeed fork"
# the fork's learning-rate variants (megatron/optimizer_param_scheduler.py get_lr), read only by its infinite-cosine
# and infinite-inv-square-root --lr-decay-style, which are not among Megatron-LM's styles here, or (the frac) under
# --lr_constant_plus_cooldown, refused
_ALCF_SCHEDULE_KNOBS = """--constant-lr --lr-constant-fraction --lr-constant-tokens --lr-cooldown-fraction
        --lr-cooldown-tokens --timescale --lr_constant_plus_cooldown_frac"""

FORK_NO_EFFECT: tuple[tuple[str, tuple[str, ...]], ...] = (
    (f"{LLM_JP} and {SWISS_AI}: logging, W&B run resumption and data-index caching choices (what is logged or "
     "where an index is cached, not what is computed)", _names("""
        --log-params-norm-per-param --enable-one-logger --one-logger-entity --wandb-id --s3-cache-path""")),
    (f"{LLM_JP} (nii-geniac): pipeline communication timing (delayed gradient reductions and parameter gathers "
     "sum and gather the same values)", _names("--delay-param-gather --no-delay-grad-reduce")),
    (f"{SWISS_AI}: the query/key norm's implementation (te, torch or apex compute the same norm)",
     _names("--qknorm-impl")),
    # (--moe-token-dropping is ours: DeepSpeed-MoE's switch, gpt/model_config.py moe_token_dropping)
    (f"{ALCF}: its pretrain_gpt_alcf.py builds the legacy megatron.model GPTModel, whose word embedding is drawn "
     "from normal(0, --init-method-std) (language_model.py Embedding: init_method=config.init_method); these set "
     "megatron/core's TransformerConfig.world_embedding_init_method, which only megatron/core's GPT embedding reads, "
     "so the fork's runs never used them", _names("--adjust-word-embedding-init --word-embedding-init-std")),
    (f"{ALCF}: the data loader's worker start method, the profiler's trace folder, and flags its code parses and "
     "never reads (--lr-finder, --train-range-to-skip)", _names("""
        --multiprocessing-context --trace-dir --lr-finder --train-range-to-skip""")),
    (f"{ALCF}: a knob of a learning-rate schedule or optimizer that is not here (its infinite-cosine and "
     "infinite-inv-square-root --lr-decay-style, --lr_constant_plus_cooldown, --optimizer dshampooadamw or "
     "adamwschedulefree are refused), so it has no effect", _names(_ALCF_SCHEDULE_KNOBS + """
        --dshampooadamw-eps --dshampooadamw-max-preconditioner-dim --dshampooadamw-precondition-freq
        --dshampooadamw-use-decoupled-weight-decay --schedulefree-for-each""")),
)

FORK_REFUSED: tuple[tuple[str, tuple[str, ...]], ...] = (
    (f"not implemented ({ALCF}'s constant schedule ending in a 1 - sqrt cooldown): use --lr-decay-style WSD "
     "--lr-wsd-decay-style minus_sqrt with --lr-wsd-decay-iters", _names("--lr_constant_plus_cooldown")),
    (f"not implemented ({ALCF}'s Muon and MuonClip, megatron/optimizer/muon.py there): --optimizer muon here is "
     "Megatron-LM's Muon, with its --muon-* flags", _names("""
        --muon-ns-steps --muonadamw-beta1 --muonadamw-beta2 --muonadamw-eps --muonclip-alpha --muonclip-t""")),
    (f"not implemented ({ALCF}: training iterations skipped, their data loaded and not stepped): every iteration "
     "steps here", _names("--train-iters-to-skip")),
    (f"not implemented ({ALCF}: DeepSpeed's MiCS, ZeRO-3 sharded within groups and replicated across them): use "
     "--zero-stage 3", _names("--use-mics")),
    (f"not implemented ({LOLA}'s static gate: one DeepSpeed-MoE TopKGate, lola_ws/overriden_classes/layer.py, "
     "shared by every MoE layer): each MoE layer has its own router here", _names("--lola-enable-static-moe-gate")),
    (f"not implemented ({SWISS_AI}'s activations xIPReLU and xIPReLUP, with learned parameters): use "
     "--xielu (its xIELU), --swiglu, --activation gelu/gelu_tanh/squared_relu", _names("--xiprelu --xiprelup")),
    (f"not implemented ({SWISS_AI}'s block variants: norms removed, post-norm blocks, norm gains initialized "
     "to another value, scaled input embeddings): every block here is a pre-norm block with a final norm",
     _names("--no-attn-layernorm --no-mlp-layernorm --no-final-layernorm --post-layer-norm")),
    (f"not implemented ({LLM_JP}, nii-geniac: the token embeddings scaled by sqrt(hidden size)): the embeddings "
     "enter the blocks unscaled", _names("--use-embedding-scaling")),
    (f"not implemented ({LLM_JP}, v4: blend weights renormalized for Megatron's mid-level oversampling): the "
     "blend here draws from each dataset in proportion to its weight", _names("--renormalize-blend-weights")),
    (f"not implemented ({LLM_JP}, nii-geniac: saves at iterations matching patterns, GCP maintenance-triggered "
     "saves, a stop iteration apart from --train-iters): use --save-interval, --exit-signal-handler and "
     "--exit-interval", _names("""
        --save-iter-patterns --use-gcp-dynamic-checkpointing --dynamic-checkpointing-min --force-stop-iter""")),
    ("Pai-Megatron-Patch's own flag (alibaba/Pai-Megatron-Patch megatron_patch/arguments.py): it selects Pai's "
     "tokenizers (--patch-tokenizer-type), dataset formats (--dataset), model variants, multimodal, fine-tuning "
     "and generation code, none of which is here; running it would take porting megatron_patch's tokenizers, "
     "datasets and models: launch with Megatron-LM's flags (--tokenizer-type HuggingFaceTokenizer "
     "--tokenizer-model DIR, --data-path of .bin/.idx made by python -m data.preprocess)", _names("""
        --adaptive-seq-len --allow-missing-vision-projection-checkpoint --attention-head-type
        --convert-checkpoint-from-megatron-to-transformers --cpu-offloading --cvcuda-image-processing --data-dir
        --dataloader-save --dataloader-seq-length --dataset --dataset-config --disable-bias-attn-fc
        --disable-bias-linear-fc --disable-parallel-output --disable-vision-class-token --enable-shared-expert
        --epochs --eval-dev --eval-fp32 --extra-vocab-size --freeze-LM --freeze-ViT --freeze-clip-vision-tower
        --freeze-llm --generation-length --image-aspect-ratio --image-folder --image-size --image-tag-type
        --input-len --language-model-type --max-num-tiles --max-padding-length --mm-projector-type
        --mm-use-im-patch-token --mm-use-im-start-end --mm-vision-select-layer --moe --moe-input-feature-slicing
        --moe-topk --n-head-kv --num-fewshot --num-frames --num-shared-experts --online-evaluation-config
        --optimizer-offload-auto-threshold --optimizer-offload-chunk-size --optimizer-offload-policy --patch-size
        --patch-tokenizer-type --position-encoding-2d --prompt-path --qk-nope-head-dim --qk-rope-head-dim
        --repetition-penalty --repetition_penalty --rotary-scale-factor --router-type --shared-moe-ffn-hidden-size
        --sliding-window --source-seq-len --spatial-merge-size --special-tokens --target-seq-len --task-list
        --temporal-patch-size --text-generate-gt-file --text-generate-input-file --text-generate-output-file --time
        --tokenizer-prompt-format --top-k --top-p --train-mode --transformer-timers --transformer-type
        --tune-mm-mlp-adapter --use-alibi-mask --use-llama2-rotary-position-embeddings
        --use-mistral-rotary-position-embeddings --use-normhead --use-te --use-thumbnail --use-tiling --verbosity
        --version --vision-model-type --vision-tower --z-loss-weight""")),
)

# option -> (the values that are a no-op, why they are, what the others would need)
FORK_AT_VALUE: dict[str, tuple[tuple, str, str]] = {
    "--input-embeddings-multiplier": (
        (1.0,), f"{SWISS_AI}: a multiplier of 1 leaves the input embeddings as they are",
        f"not implemented ({SWISS_AI}: the input embeddings multiplied by a constant): use 1 or drop the flag"),
    "--layernorm-init": (
        (1.0,), f"{SWISS_AI}: norm gains start at 1, as here",
        f"not implemented ({SWISS_AI}: norm gains initialized to another value): norm gains start at 1 here"),
    "--encoder-tensor-model-parallel-size": (
        (0,), f"{LLM_JP} and {SWISS_AI}: an encoder's parallel size; a GPT has no encoder (0, the default)",
        "encoder-decoder and multimodal encoders are not implemented: a GPT has no encoder (use 0)"),
    "--encoder-pipeline-model-parallel-size": (
        (0,), f"{LLM_JP} and {SWISS_AI}: an encoder's parallel size; a GPT has no encoder (0, the default)",
        "encoder-decoder and multimodal encoders are not implemented: a GPT has no encoder (use 0)"),
}
