"""What each harvested Megatron-LM / Megatron-DeepSpeed / DeepSpeed flag that is not one of ours
(nor an alias of one, arguments/megatron/flags.py) does here, by group, each group with its reason.

The names come from arguments/megatron/flags_harvested.json (scripts/tools/harvest_megatron_flags.py); a test fails
when a harvested name is in no class. Three tables:

- `NO_EFFECT`: accepted, no effect on the math; listed once, with the group's reason, in the one info
  line at the start of a run (and in --print-config).
- `REFUSED`: a feature that would change the math and does not exist here; one line with what to use.
- `AT_VALUE`: a feature that is a no-op at one value (`--num-experts 1`, `--optimizer adam`): accepted
  there with no effect, refused at any other value.

A "knob" group holds the settings of a feature that is off here: without its switch (which is refused
or at its no-op value) Megatron ignores them too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from arguments.megatron.fork_flag_classes import FORK_AT_VALUE, FORK_NO_EFFECT, FORK_REFUSED
from gpt.moe.settings import largest_expert_count


def _names(text: str) -> tuple[str, ...]:
    return tuple(text.split())


# ---- accepted, no effect on the math --------------------------------------------------------------------

NO_EFFECT: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("logging: what Megatron logs and where; here every --log-interval record (loss, lr, grad_norm, loss_scale, "
     "batch size, timings, tokens/s, TFLOP/s, memory) goes to --metrics-file, and to TensorBoard and W&B when "
     "they are on", _names("""
        --log-timers-to-tensorboard --log-batch-size-to-tensorboard --log-validation-ppl-to-tensorboard
        --log-optimizer-states-to-tensorboard --log-memory-to-tensorboard --log-world-size-to-tensorboard
        --no-log-learnig-rate-to-tensorboard --no-log-loss-scale-to-tensorboard --disable-log-loss-scale-to-tensorboard
        --tensorboard-log-interval --tensorboard-queue-size --log-params-norm --log-num-zeros-in-grad
        --log-throughput --log-progress --log-energy --log-memory-interval --log-device-memory-used
        --log-max-attention-logit --timing-log-level --timing-log-option --no-barrier-with-level-1-timing
        --log-level --log-level-replica --logging-level --log-path --codecarbon-dir --config-logger-dir
        --one-logger-async --one-logger-project --one-logger-run-name --no-one-logger
        --app-tag-run-name --app-tag-run-version --otel-enabled --otel-service-name --otel-span-groups""")),
    ("profiling and diagnostics: they observe a run without changing what it computes (--profile-checkpointing "
     "times the checkpointed groups here; --check-for-large-grads: gradient norms are not validated by the rerun "
     "state machine here, a non-finite one stops the run)", _names("""
        --profile --profile-ranks --profile-step-start --profile-step-end --profile_steps --profile-backward
        --use-pytorch-profiler --pytorch-profiler-collect-callstack --pytorch-profiler-collect-chakra
        --pytorch-profiler-collect-shapes --record-shapes --nvtx-ranges --record-memory-history --memory-snapshot-path
        --dump-param-to-param-group-map --save-activations-interval --save-dgrads-interval --save-params-interval
        --save-wgrads-interval --run-workload-inspector-server --straggler-ctrlr-port --gpu-sniff-test-interval
        --check-weight-hash-across-dp-replicas-interval --check-for-large-grads --test-mode""")),
    ("a kernel or implementation choice: the same values are computed either way (one implementation here: "
     "PyTorch layers with SDPA attention)", _names("""
        --bias-gelu-fusion --bias-dropout-fusion --scaled-masked-softmax-fusion --no-rope-fusion
        --scaled-upper-triang-masked-softmax-fusion --no-bias-swiglu-fusion --no-persist-layer-norm
        --disable-mem-efficient-ln --disable-jit-fuser --cross-entropy-fusion-impl
        --no-gradient-reduce-div-fusion --abort-on-unmet-fused-kernel-constraints
        --disable-bf16-reduced-precision-matmul --deterministic-mode --batch-invariant-mode
        --batch-invariant-backend --transformer-impl --use-mcore-models --use-legacy-models
        --use-transformer-engine-op-fuser --use-te-activation-func --te-rng-tracker --inference-rng-tracker
        --flash-attention-version --ds_fused_adam --no-create-attention-mask-in-dataloader --mlp-chunks-for-training
        --manual-gc --manual-gc-interval --no-manual-gc-eval --disable-manual-gc-eval --empty-unused-memory-level
        --train-sync-interval --enable-experimental
        --export-te-mcore-model --export-default-te-spec --export-force-local-attention
        --export-legacy-megatron""")),
    ("Megatron-LM's layer and activation offloading (Transformer Engine's CPU offload context, "
     "megatron/core/pipeline_parallel/fine_grained_activation_offload.py) moves saved activations to the host and "
     "back: the same values; not built here, they stay on the device (--cpu-checkpointing offloads checkpoints)",
     _names("--cpu-offloading-num-layers --fine-grained-activation-offloading")),
    ("Megatron-LM's CUDA graph of the optimizer step (OptimizerCudaGraphWrapper, megatron/training/training.py, over a "
     "capturable Adam): the step here reads the gradient norm and fp16's overflow verdict back to the host, which a "
     "graph cannot, so it runs eagerly: the same update (the blocks' graphs are --cuda-graph-impl's)",
     _names("--optimizer-cuda-graph")),
    ("a communication or overlap choice: data parallelism here is ZeRO's bucketed reducer (--reduce-bucket-size, "
     "--overlap-comm, --overlap-param-gather) and sums the same gradients", _names("""
        --DDP-impl --no-contiguous-buffers-in-local-ddp --use-contiguous-buffers-in-ddp
        --no-async-tensor-model-parallel-allreduce --ddp-average-in-collective --ddp-num-buckets
        --ddp-pad-buckets-for-high-nccl-busbw --ddp-param-name-patterns-for-fp32-local-accumulation
        --ddp-reduce-scatter-with-fp32-accumulation --no-align-grad-reduce --disable-align-grad-reduce
        --no-align-param-gather --overlap-param-gather-with-optimizer-step --suggested-communication-unit-size
        --use-nccl-ub --symmetric-ar-type --disable-symmetric-registration --create-all-gather-group
        --high-priority-stream-groups --high-priority-a2a-comm-stream --delay-wgrad-compute
        --defer-embedding-wgrad-compute --wgrad-deferral-limit --tp-comm-overlap --tp-comm-overlap-cfg
        --tp-comm-overlap-rs-dgrad --tp-comm-bootstrap-backend --no-tp-comm-bulk-dgrad --disable-tp-comm-bulk-dgrad
        --no-tp-comm-bulk-wgrad --disable-tp-comm-bulk-wgrad --no-tp-comm-overlap-ag --disable-tp-comm-overlap-ag
        --no-tp-comm-overlap-rs --disable-tp-comm-overlap-rs --no-tp-comm-split-ag --disable-tp-comm-split-ag
        --no-tp-comm-split-rs --disable-tp-comm-split-rs --tensor-parallel-num-weight-shards
        --gtp-remat-nccl-ub --gtp-remat-opt-in-modules --gtp-remat-reduce-scatter-with-fp32-accumulation
        --nccl-communicator-config-path --use-sharp --sharp-enabled-group --disable-gloo-process-groups
        --use-tp-pp-dp-mapping --no-clone-scatter-output-in-embedding --disable-clone-scatter-output-in-embedding
        --sync-tp-duplicated-parameters""")),
    ("a setting of Megatron's fully sharded data parallelism (--use-torch-fsdp2 and --use-megatron-fsdp are the "
     "ZeRO stage that shards the same states here); buffers, dtypes of its communication and the hybrid (HSDP) "
     "outer group, which exists only with --num-distributed-optimizer-instances above 1", _names("""
        --outer-dp-sharding-strategy --enable-full-sharding-in-hsdp --fsdp-double-buffer --fsdp-db-use-persist-buf-on-alloc-fail --fsdp-manual-registration
        --megatron-fsdp-enable-fine-grained-param-gather --megatron-fsdp-grad-comm-dtype
        --megatron-fsdp-main-grads-dtype --megatron-fsdp-main-params-dtype --megatron-fsdp-max-pool-double-buffer
        --megatron-fsdp-version --no-use-layer-wise-param-layout""")),
    ("a memory-layout switch of DeepSpeed's Megatron forks (how a tensor is split or tiled while the same values "
     "are computed); ZeRO's partitioning here is --zero-stage, --partition-activations", _names("""
        --scattered-embeddings --split-transformers --memory-centric-tiled-linear --tile-factor""")),
    ("where or whether initial weights are materialized: each rank here creates only what it holds, from a "
     "counter-based function of --seed, the same values on any device (a loaded checkpoint replaces them)", _names("""
        --use-cpu-initialization --init-model-with-meta-device --no-initialization --lazy-mpu-init""")),
    ("every implementation (mmap, cached, lazy, infer) reads the same .bin/.idx tokens, memory-mapped here",
     _names("--data-impl --mmap-warmup --no-mmap-bin-files")),
    ("how the .bin/.idx data is read or its index built (threads, caches, storage clients, sharding of the "
     "loader); every data-parallel rank here reads its slice of the same samples", _names("""
        --num-dataset-builder-threads --dataloader-fast-cache-load --dataloader-defer-npy-index-mmap
        --object-storage-cache-path --enable-msc --disable-msc --mid-level-dataset-surplus
        --per-dataset-sequences-path --repeated-dataloader --return-data-index --valid-num-workers
        --input-data-sizes-file --allow-ambiguous-pad-tokens""")),
    ("raw-text options of DeepSpeedExamples' GPT-2 loader (JSON keys, sentence splitting, shuffling); data here "
     "is tokenized beforehand into .bin/.idx (python -m data.preprocess) and always shuffled by --seed",
     _names("--presplit-sentences --loose-json --text-key --delim --shuffle")),
    ("which background writer --async-save uses (nvidia-resiliency-ext's or Megatron-Core's process) and whether "
     "it stages into shared memory for it: here one writer thread per rank writes from the rank's own host copy "
     "(checkpoint/ours/async_save.py)", _names("--async-strategy --async-ckpt-use-cpu-shm")),
    ("how checkpoints are written or read (format, parallel and asynchronous I/O, extra local copies, "
     "integrity checks); checkpoints here are sharded safetensors with a metadata.json, always verified on load "
     "and holding the optimizer state and random streams (--no-load-optim, --no-load-rng choose what a resume "
     "takes)", _names("""
        --auto-detect-ckpt-format --ckpt-assume-constant-structure --ckpt-fully-parallel-load
        --ckpt-fully-parallel-load-per-rank-objects --ckpt-fully-parallel-load-exchange-algo
        --ckpt-fully-parallel-load-process-group --ckpt-fully-parallel-save --no-ckpt-fully-parallel-save
        --ckpt-fully-parallel-save-process-group --ckpt-pg-tensors-cache-create --ckpt-pg-tensors-cache-path
        --ckpt-drop-redundant-extra-state --dist-ckpt-format --dist-ckpt-optim-fully-reshardable
        --dist-ckpt-save-pre-mcore-014 --dist-ckpt-strictness --dist-ckpt-workers
        --distrib-optim-fully-reshardable-mem-efficient --use-dist-ckpt
        --non-persistent-ckpt-type --non-persistent-global-ckpt-dir --non-persistent-local-ckpt-algo
        --non-persistent-local-ckpt-dir --non-persistent-save-interval --replication --replication-factor
        --replication-jump --save-retain-interval --no-save-optim --no-save-rng
        --no-ckpt-load-validate-sharding-integrity --disable-ckpt-load-validate-sharding-integrity
        --no-strict-fsdp-dtensor-load --disable-strict-fsdp-dtensor-load --load-main-params-from-ckpt
        --ckpt-convert-update-legacy-dist-opt-format --verify-integrity --no-save-tokenizer-assets
        --disable-save-tokenizer-assets --no-use-tokenizer-model-from-checkpoint-args
        --disable-use-tokenizer-model-from-checkpoint-args --use-mp-args-from-checkpoint-args""")),
    ("in-process restart's hang detection and its monitor process (nvidia-resiliency-ext's progress watchdog, soft "
     "and hard timeouts, SIGTERM-then-SIGKILL of a hung rank, the last-call window, CUDA's cache): not built here; "
     "--inprocess-restart restarts on an error or a rank whose heartbeat stopped (resilience/inprocess_restart.py), "
     "a hung rank that still beats ends at --distributed-timeout-minutes", _names("""
        --inprocess-hard-timeout --inprocess-soft-timeout --inprocess-progress-watchdog-interval
        --inprocess-monitor-process-interval --inprocess-monitor-thread-interval --inprocess-last-call-wait
        --inprocess-termination-grace-time --inprocess-empty-cuda-cache""")),
    ("launcher and cluster plumbing (autoresume, timeouts, signals, MPI "
     "discovery); ranks and devices come from torchrun or SLURM here, and --exit-signal-handler saves on "
     "SIGTERM or SIGUSR1", _names("""
        --adlr-autoresume --adlr-autoresume-interval
        --distributed-timeout-seconds-after-init
        --aml-data-download-path --exit-signal --exit-signal-handler-for-dataloader --exit-signal-handler-for-training
        --deepspeed_mpi --trust-remote-code""")),
    ("Megatron-DeepSpeed defines it and never reads it (a resume here continues the schedule at the consumed "
     "samples; --override-opt_param-scheduler chooses this run's schedule)", _names("--no-load-lr-state")),
    ("DeepSpeed's engine switch (deprecated name of --deepspeed): ZeRO is always on here (--zero-stage, "
     "--zero-config)", _names("--deepscale")),
    ("an fp16 overflow guard of the attention softmax: SDPA accumulates the softmax in fp32 here, and "
     "query-key layer scaling leaves the softmax's value the same", _names("""
        --attention-softmax-in-fp32 --apply-query-key-layer-scaling --no-query-key-layer-scaling""")),
    ("the cross entropy here is computed in fp32 whatever the logits' dtype",
     _names("--fp16-lm-cross-entropy --output-logit-dtype")),
    ("Megatron's ONNX-safe GeLU is the exact erf GeLU, its default; the activation here is --activation",
     _names("--onnx-safe")),
    ("a global batch not divisible by micro batch x data-parallel size is an error here, so no batch is ever "
     "decreased", _names("--decrease-batch-size-if-needed")),
    ("evaluation only (how many batches, when, on which sets): training is the same; validation here runs "
     "--eval-iters batches of the valid split every --eval-interval", _names("""
        --full-validation --multiple-validation-sets --validation-set-names --eval-micro-batch-size
        --eval-global-batch-size --start-eval-at-iter --eval-batch-size --eval-seq-length""")),
    ("pipeline parallelism's transport or inference knob: how stages exchange tensors (here batched isend/irecv, "
     "training/pipeline_step.py), not what they compute", _names("""
        --no-pipeline-parallel
        --overlap-p2p-communication --no-overlap-p2p-communication --overlap-p2p-communication-warmup-flush
        --use-ring-exchange-p2p --no-scatter-gather-tensors-in-pipeline
        --pipeline-model-parallel-comm-backend --delta-offload-bytes-across-pp-ranks
        --inference-batch-times-seqlen-threshold""")),
    ("context parallelism's knob for what is not built here (hybrid or packed-sequence CP): without it the ring or "
     "all-gather over --context-parallel-size runs as Megatron's default", _names("""
        --hybrid-context-parallel --max-seqlen-per-dp-cp-rank""")),
    ("DeepSpeed sequence parallelism's knob: forced at size 1 it computes the same attention, and FPDT (Ulysses "
     "in chunks, offloaded) the same attention as the all-to-all of --ds-sequence-parallel-size here", _names("""
        --force-ds-sequence-parallel --ds-sequence-parallel-fpdt --ds-sequence-parallel-fpdt-chunk-size
        --ds-sequence-parallel-fpdt-offloading""")),
    ("a mixture-of-experts implementation or logging choice: the experts run as one grouped matmul where torch has "
     "one for the device, else a loop, with the same values (gpt/moe/experts.py); at expert-parallel size 1 every "
     "dispatcher computes the same combination; the load-balancing loss is logged beside the LM loss; DeepSpeed-MoE's Tutel "
     "kernels and separate MoE parameter groups compute the same update", _names("""
        --ep-overlap-early-attn-memory-release --moe-grouped-gemm --moe-layer-recompute
        --moe-permute-fusion --moe-router-fusion --moe-shared-expert-overlap
        --moe-use-legacy-grouped-gemm --overlap-dispatch-backward-with-experts-wgrad
        --overlap-moe-expert-parallel-comm --save-tokens-per-expert-interval --use-grouped-gemm-for-dense-mlp
        --use-grouped-gemm-for-shared-expert --use-tutel --create-moe-param-group""")),
    ("the flex dispatcher's kernel resources (GPU SMs, blocks, fused permutes, zero-copy buffers, padding to the "
     "group's largest input): --moe-token-dispatcher-type flex runs the alltoall dispatcher here, which moves the "
     "same tokens", _names("""
        --moe-flex-dispatcher-num-sms --moe-deepep-num-sms --moe-hybridep-num-sms --moe-hybridep-num-sms-preprocessing
        --moe-hybridep-num-blocks-permute --moe-hybridep-num-blocks-unpermute --moe-permute-fusion-into-hybridep
        --moe-hybridep-pad-uneven-dispatch-inputs --moe-ncclep-zero-copy""")),
    ("multimodal or relative position embeddings' knob: positions here are learned, rotary (rope, yarn) or none "
     "(--position-embedding-type), so it has no effect", _names("""
        --mrope-section --relative-attention-num-buckets --relative-attention-max-distance""")),
    ("NVIDIA ModelOpt's GPT-OSS switch: its YaRN settings reach the model only through ModelOpt's model builder, which "
     "Megatron-LM's pretrain_gpt.py runs for a loaded ModelOpt checkpoint (megatron/post_training/model_builder.py, "
     "model_provider.py's modelopt_enabled); a pretraining launch builds the model from its flags "
     "(--position-embedding-type yarn and the --yarn-* flags set GPT-OSS's positions here)", _names("""
        --enable-gpt-oss""")),
    ("multi-latent attention's inference or fusion knob: latents cached for decoding (inference only), and the "
     "down projections fused into one matmul, compute the same training step", _names("""
        --cache-mla-latents --mla-down-proj-fusion""")),
    ("experimental attention and layer variants' knob (sparse indexer, gated delta nets, gated "
     "linear units, hyper-connections, Mamba and hybrid stacks); their switches are refused, so it has no effect",
     _names("""
        --dsa-indexer-head-dim --dsa-indexer-k-norm-epsilon --dsa-indexer-k-norm-fp32 --dsa-indexer-loss-coeff
        --dsa-indexer-n-heads --dsa-indexer-rope-interleaved --dsa-indexer-skip-topk-offset --dsa-indexer-topk
        --dsa-indexer-topk-freq --dsa-indexer-use-sparse-loss --dsa-kernel-backend --no-dsa-indexer-rotate-activation
        --disable-dsa-indexer-rotate-activation --no-dsa-indexer-scoring-relu --disable-dsa-indexer-scoring-relu
        --gdp-cutedsl-kernel --gdp-num-chunk-states-to-recompute
        --gdp-num-householder --use-fused-weighted-squared-relu
        --fused-residual-rmsnorm --mhc-init-gating-factor --mhc-num-residual-streams --mhc-recompute-layer-num
        --mhc-sinkhorn-iterations
        --mamba-inference-conv-states-dtype --mamba-inference-ssm-states-dtype --mamba-training-ssm-states-dtype
        --disable-mamba-mem-eff-path --hybrid-attention-ratio --hybrid-mlp-ratio""")),
    ("a knob of an FP8/FP4 feature that is off here (--fp8-interval is deprecated in Megatron-LM; the custom "
     "recipe's quantizer factory, Megatron FSDP's transpose cache and --fp4-format are refused or absent), so it "
     "has no effect", _names("""
        --fp8-interval --fp8-quantizer-factory --keep-fp8-transpose-cache
        --fp4-recipe --fp4-param-gather --fp4-quantizer-factory
        --kitchen-attention-backend""")),
    # Megatron-LM's distributed optimizer gathers MXFP8 weights in bf16 into a parameter buffer and casts them into
    # the MXFP8 parameters' own storage (param_and_grad_buffer.py); the flag places that buffer in the gradient
    # buffer's memory. Here the gathers write the e4m3 bytes the GEMMs read (zero/fp8_params.py), so no such buffer
    # exists to place.
    ("memory only: in Megatron-LM it puts --fp8-param-gather's MXFP8 all-gather buffer in the gradient buffer's "
     "memory; here the gathers write the e4m3 bytes the GEMMs read through the forward and the backward, while the "
     "gradient buffer fills, so there is no separate buffer to place and the same values are computed",
     _names("--reuse-grad-buf-for-mxfp8-param-ag")),
    ("CPU offload's knob: the offloaded step here (--offload-optimizer, alias --cpu-optimizer; Megatron-LM's "
     "--optimizer-cpu-offload) is PyTorch's fused AdamW, pinned where CUDA is, and Megatron-LM's layer and "
     "activation offloading are not built, so it has no effect", _names("""
        --cpu_torch_adam --use-pin-memory --activation-offload-fraction
        --offload-modules --min-offloaded-tensor-size --cpu-offloading-retain-pinned-cpu-buffers
        --delay-offload-until-cuda-graph --fine-grained-offloading-max-inflight-offloads""")),
    # Megatron-LM's hybrid CPU optimizer (--optimizer-cpu-offload, arguments/megatron/cpu_offload_flags.py): its knobs
    # that change no value computed.
    ("the hybrid optimizer's overlapped copies: Megatron-LM moves the gradients to the host and the updated "
     "parameters back on side streams while the host steps (hybrid_optimizer.py, overlap_cpu_optimizer_d2h_h2d); "
     "here those copies are synchronous, the same values either way, and a CPU run has no copies at all",
     _names("--overlap-cpu-optimizer-d2h-h2d")),
    ("the hybrid optimizer's device-side class: Megatron-LM's get_megatron_optimizer sets it back to its fused Adam "
     "right after reading this flag (megatron/core/optimizer/__init__.py), so its host step is torch's AdamW and "
     "its device step the fused Adam either way, as here (torch's fused AdamW on the host)",
     _names("--use-torch-optimizer-for-cpu-offload")),
    ("page-locking the hybrid optimizer's host gradients and parameters (Megatron-LM's pin_cpu_grads, "
     "pin_cpu_params) speeds the copies and changes no value; the host buffers here are pinned by "
     "--offload-pin-memory, where CUDA is present", _names("--no-pin-cpu-grads --no-pin-cpu-params")),
    ("another optimizer's knob (SGD, Lion, weight-decay ramps, Muon's Triton SYRK kernel): the "
     "optimizers here are Adam(W), AdEMAMix and Muon with a constant --weight-decay, so it has no effect", _names("""
        --sgd-momentum --muon-use-syrk --lion-beta1 --lion-beta2 --start-weight-decay
        --end-weight-decay --qk-clip-alpha --qk-clip-threshold""")),
    ("a tokenizer option for tokenizer types not here, or for how text was tokenized; training reads token ids "
     "from the .bin/.idx (--tokenizer-type: GPT2BPETokenizer, HuggingFaceTokenizer, NullTokenizer)", _names("""
        --tokenizer-hf-no-use-fast --tokenizer-hf-no-include-special-tokens --tokenizer-metadata
        --tokenizer-sentencepiece-legacy --no-tokenizer-sentencepiece-ignore-extra-whitespaces
        --disable-tokenizer-sentencepiece-ignore-extra-whitespaces --legacy-tokenizer --tiktoken-num-special-tokens
        --tiktoken-pattern --tiktoken-special-tokens --tokenizer-model-type --tokenizer-path --null-tokenizer-pad-id
        --chat-template --use-gigatoken""")),
    ("knowledge distillation's, supervised fine-tuning's or muP's knob: those are refused "
     "(--kd, --mos, --logits-load-dir, --sft, --use-mup), so it has no effect", _names("""
        --kd-alpha-ce --kd-beta-ce --kd-temp --num-layers-teacher --hidden-size-teacher --num-attention-heads-teacher
        --num-experts-teacher --load-teacher --logits-load-decode-threads --logits-load-ignore-errors
        --logits-load-kd-loss-alpha --logits-load-msc-prefetch-depth --logits-load-prefetch-factor --logits-save-dir
        --logits-save-dtype --logits-save-top-k --logits-save-top-p --logits-save-top-p-min-k
        --sft-tokenizer-prompt-format --mup-attn-scale-power
        --mup-base-head-dim --mup-base-hidden-size --mup-embedding-mult --mup-output-mult --mup-width-mult""")),
    ("ALBERT-style parameter sharing's knob: every layer has its own parameters here (--num-unique-layers is the "
     "number of layers), so it has no effect", _names("--param-sharing-style")),
    ("read only by Megatron's other programs (BERT, T5, prefix-LM, ICT/REALM retrieval, RETRO, vision, DINO, "
     "reinforcement learning, inference serving, text generation, evaluation tasks); their pretrain_gpt.py "
     "ignores it too", _names("""
        --bert-load --bert-no-binary-head --bert-embedder-type --output-bert-embeddings --biencoder-projection-dim
        --biencoder-shared-query-context-model --ict-head-size --ict-load --block-data-path --titles-data-path
        --evidence-data-path --embedding-path --indexer-batch-size --indexer-log-interval --query-in-block-prob
        --use-one-sent-docs --short-seq-prob --mask-prob --retriever-report-topk-accuracies --retriever-score-scaling
        --retriever-seq-length --report-topk-accuracies --faiss-use-gpu --sample-rate
        --decoder-num-layers --decoder-seq-length --mean-noise-span-length --noise-density
        --loss-on-targets-only --reweight-loss-based-on-position-frequency --retro-add-retriever --retro-attention-gate
        --retro-cyclic-train-iters --retro-encoder-attention-dropout --retro-encoder-hidden-dropout
        --retro-encoder-layers --retro-no-verify-neighbor-count --retro-num-neighbors --retro-num-retrieved-chunks
        --retro-project-dir --retro-return-doc-ids --retro-workdir --vision-pretraining --vision-pretraining-type
        --vision-backbone-type --swin-backbone-type --img-h --img-w --img-dim --patch-dim --num-channels --num-classes
        --classes-fraction --data-per-class-fraction --mask-factor --mask-type --iter-per-epoch --head-lr-mult
        --dino-bottleneck-size --dino-freeze-last-layer --dino-head-hidden-size --dino-local-crops-number
        --dino-local-img-size --dino-norm-last-layer --dino-teacher-temp --dino-warmup-teacher-temp
        --dino-warmup-teacher-temp-epochs --perform-rl-step --langrl-env-config --langrl-external-server
        --no-langrl-external-server --langrl-inference-server-conversation-template --langrl-inference-server-type
        --grpo-clamp-eps-lower --grpo-clamp-eps-upper --grpo-default-temperature --grpo-default-top-p
        --grpo-entropy-term-weight --grpo-filter-groups-with-same-reward --grpo-group-size --grpo-iterations
        --grpo-kl-beta --grpo-prompts-per-step --refit-method --rl-calculate-intra-group-similarity
        --no-rl-calculate-intra-group-similarity --rl-consumption-granularity --rl-default-temperature
        --rl-default-top-k --rl-default-top-p --rl-durable-rollout-bank --rl-generation-lag
        --rl-importance-sampling-truncation-coef --rl-inference-expert-model-parallel-size
        --rl-inference-expert-tensor-model-parallel-size --rl-inference-logprobs-is-correction
        --no-rl-inference-logprobs-is-correction --rl-inference-model-unified-memory-level --rl-inference-parsers
        --rl-inference-pipeline-model-parallel-size --rl-inference-tensor-model-parallel-size
        --rl-kv-cache-management-mode --rl-max-inflight-requests --rl-offload-inference-model-weights-when-idle
        --no-rl-offload-inference-model-weights-when-idle --rl-offload-kv-cache-during-training
        --no-rl-offload-kv-cache-during-training --rl-offload-optimizer-during-inference --rl-partial-rollouts
        --no-rl-partial-rollouts --rl-persist-cuda-graphs --no-rl-persist-cuda-graphs --rl-profile --rl-profile-dir
        --rl-prompts-per-eval --rl-remove-kv-cache-during-training --no-rl-remove-kv-cache-during-training
        --rl-reset-cuda-graphs --no-rl-reset-cuda-graphs --rl-rollout-bank-dir --rl-rollout-bank-max-bytes
        --rl-sequence-packing-algo --rl-sequence-packing-bin-size --rl-sequence-packing-max-sequences-per-bin
        --rl-skip-bos-token --no-rl-skip-bos-token --rl-submission-granularity --rl-training-cuda-graphs
        --no-rl-training-cuda-graphs --rl-use-sequence-packing --no-rl-use-sequence-packing
        --rl-verify-model-weights-swap --no-rl-verify-model-weights-swap --inference-coordinator-port
        --inference-cuda-graph-all-prefills --inference-cuda-graph-max-tokens --inference-cuda-graph-scope
        --inference-disable-ep-consensus --no-inference-disable-ep-consensus --inference-disable-triton-nvls-kernels
        --inference-dynamic-batching --inference-dynamic-batching-async-sched-mode
        --inference-dynamic-batching-block-size --inference-dynamic-batching-buffer-guaranteed-fraction
        --inference-dynamic-batching-buffer-overflow-factor --inference-dynamic-batching-buffer-size-gb
        --inference-dynamic-batching-cuda-graph-mixed-prefill-count
        --inference-dynamic-batching-cuda-graph-sizing-distribution --inference-dynamic-batching-logprobs-mode
        --inference-dynamic-batching-mamba-memory-ratio --inference-dynamic-batching-max-requests
        --inference-dynamic-batching-max-requests-override --inference-dynamic-batching-max-tokens
        --inference-dynamic-batching-max-tokens-override --inference-dynamic-batching-num-cuda-graphs
        --inference-dynamic-batching-paused-buffer-size-gb --inference-dynamic-batching-prefix-caching
        --no-inference-dynamic-batching-prefix-caching --inference-dynamic-batching-prefix-caching-coordinator-policy
        --inference-dynamic-batching-prefix-caching-eviction-policy --inference-dynamic-batching-prefix-caching-mamba-gb
        --inference-dynamic-batching-prefix-caching-routing-alpha --inference-dynamic-batching-sampling-backend
        --inference-dynamic-batching-track-generated-token-events
        --inference-dynamic-batching-track-paused-request-events --inference-dynamic-batching-unified-memory-level
        --inference-fuse-tp-communication --inference-grouped-gemm-backend --inference-logging-step-interval
        --inference-max-batch-size --inference-max-requests --inference-max-seq-length
        --inference-moe-disable-fused-quant-kernels --inference-moe-token-dispatcher-type --inference-shards
        --inference-text-gen-server-logging --no-inference-text-gen-server-logging
        --inference-use-synchronous-zmq-collectives --no-inference-use-synchronous-zmq-collectives
        --inference-wandb-logging --no-inference-wandb-logging --flash-decode --decode-only-cuda-graphs
        --mlp-chunks-for-prefill --num-speculative-tokens --nccl-all-reduce-for-prefill --enable-chunked-prefill
        --disable-chunked-prefill --use-legacy-static-engine --use-same-sampling-seed-across-dp-ranks
        --max-tokens-to-oom --ds-inference --cloze-eval
        --eval-hf --load-openai --temperature --top_k --top_p --out-seq-length --overlapping-eval --eval-text-key
        --eval-max-preds-per-seq --max-preds-per-seq --pretrained-bert --intermediate-size --deep-init
        --use-tfrecords""")),
)


# ---- refused: the feature would change the math and does not exist here ----------------------------------

REFUSED: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("NVIDIA ModelOpt's post-training (Megatron-LM's megatron/post_training/arguments.py, add_modelopt_args, which "
     "its pretrain_gpt.py adds when nvidia-modelopt is installed: quantization, knowledge distillation from a "
     "teacher checkpoint, ModelOpt checkpoints, SFT data, speculative-decoding heads, GPT-OSS's YaRN) is not "
     "implemented: pretrain without it, or run it with Megatron-LM and nvidia-modelopt", _names("""
        --export-quant-cfg --export-kd-teacher-load --export-kd-teacher-model-config --export-kd-teacher-ckpt-format
        --export-kd-cfg --finetune-hf-dataset --finetune-data-split --finetune-data-files --qad-train-target
        --freeze-base-for-mtp --export-qk-l2-norm --export-moe-apply-probs-on-input --export-offline-model
        --modelopt-enabled""")),
    ("not implemented: the MLP here is GeLU (--activation gelu or gelu_tanh), squared ReLU (--squared-relu), "
     "SwiGLU (--swiglu) or quick-GeGLU (--quick-geglu)", _names("""
        --glu-activation""")),
    ("not implemented: --normalization before each sublayer and after the last block (--qk-layernorm or "
     "--qk-l2-norm over query and key heads), as in GPT-2 and Llama", _names("--embed-layernorm")),
    # megatron/core/transformer/transformer_config.py @ d98e8a64 declares apply_residual_connection_post_layernorm and
    # nothing reads it; megatron/model/transformer.py of Megatron-LM 23.04 and Megatron-DeepSpeed does
    ("not implemented: the residual here is each sublayer's input; Megatron-LM's legacy models and Megatron-DeepSpeed "
     "take it after the input norm (BERT's order), while Megatron-Core never reads the flag: drop it",
     _names("--apply-residual-connection-post-layernorm")),
    ("not implemented: every block is a mixer then its MLP, chosen by the model flags or --hybrid-layer-pattern "
     "(`*-`, `*E`, `G-`, ...)", _names("""
        --heterogeneous-layers-config-path --heterogeneous-layers-config-encoded-json --enable-mhc-connections""")),
    # Megatron-Core's muP (megatron/core/transformer/transformer_config.py __post_init__, megatron/core/utils.py
    # mup_scaled_init_method_normal, language_module.py _scale_logits, optimizer/__init__.py
    # get_mup_config_overrides): four rules over the model and the optimizer, none of which exists here
    ("not implemented: Megatron-Core's maximal update parameterization (muP) with width multiplier m = "
     "--hidden-size / --mup-base-hidden-size: hidden init std / sqrt(m) and output-layer std / (sqrt(2L) sqrt(m)), "
     "attention softmax scale 1/d_head, logits x 1/m, and Adam's lr and eps / m for hidden matrices; train "
     "with the standard parameterization (drop --use-mup)", _names("--use-mup")),
    ("not implemented: Megatron-LM's packed-sequence attention over the documents the dataset's index records in "
     "each sample (cu_seqlens); --reset-attention-mask splits attention at end-of-document tokens instead",
     _names("--dataloader-inter-document-masking")),
    ("not implemented: the data is one --data-path (a prefix or a weighted blend) split into train, valid and "
     "test documents by --split, or Megatron-LM's one blend per split (--train-data-path, --valid-data-path, "
     "--test-data-path)", _names("""
        --train-weighted-split-paths --valid-weighted-split-paths --test-weighted-split-paths
        --train-weighted-split-paths-path --valid-weighted-split-paths-path --test-weighted-split-paths-path
        --valid-data --test-data --val-data-path --use-npy-data-loader --phase-transition-iterations""")),
    ("not implemented: the training samples are a function of --data-path, --split, --seq-length and --seed, "
     "read in the order the sampler draws them (no curriculum, skipped ranges, fixed epochs or precomputed "
     "index files)", _names("""
        --skip-train-iteration-range --iterations-to-skip --train-data-exact-num-epochs --train-desc-path
        --train-doc-idx-path --train-idx-path --train-sample-idx-path --train-shuffle-idx-path
        --data-efficiency-curriculum-learning --random-ltd""")),
    ("not implemented: pretraining on the .bin/.idx data only; without --data-path the embedded corpus is used",
     _names("--sft")),
    ("not implemented: weights are drawn from normal(0, --init-method-std), output projections scaled by "
     "1/sqrt(2 x layers) (Megatron-LM's Xavier-uniform draws each tensor-parallel shard by its own fan-in and "
     "fan-out)", _names("--init-method-xavier-uniform")),
    ("not implemented: every parameter and activation follows --bf16 or --fp16 (fp32 master weights and Adam "
     "states in the ZeRO optimizer)", _names("""
        --fp32-embedding --fp32-layernorm --fp32-tokentypes --embedding-weights-in-fp32""")),
    ("fp8/fp4 training is not implemented: use --bf16 or --fp16", _names("""
        --fp4-format --te-precision-config-file --kitchen-config-file
        --kitchen-recipe-number --use-kitchen-attention""")),
    ("not implemented yet (issue 65): FP8 GEMMs (--fp8-format) run the output layer in high precision; drop it",
     _names("--fp8-output-proj")),
    ("not implemented: the optimizer here is Adam(W) with fp32 states, and all parameters trained",
     _names("""
        --use-bnb-optimizer --qk-clip --freeze-all-layers""")),
    ("knowledge distillation is not implemented: train the model on its data", _names("""
        --kd --mos --logits-load-dir""")),
    ("not implemented: a fake process group skips the communication, so the results are not a training run's",
     _names("--fake-process-group")),
    ("not implemented: give the model's flags on the command line (--load checks that they match the checkpoint)",
     _names("--use-checkpoint-args")),
    ("not implemented: --load DIR/iter_NNNNNNN (or --ckpt-step N) loads one iteration's checkpoint, and resumes "
     "at its iteration and consumed samples", _names("--load-tag --override-ckpt-iteration")),
    ("not implemented: --load DIR --finetune starts from a checkpoint's weights at iteration 0", _names("""
        --pretrained-checkpoint --reset-iteration""")),
    ("not implemented: a checkpoint is converted here by scripts/tools/reshard_checkpoint.py and "
     "scripts/tools/convert_to_hf.py (--load reads DeepSpeed's ZeRO and universal checkpoints as they are)", _names("""
        --ckpt-convert-format --ckpt-convert-save""")),
    ("not implemented: pretrain_gpt.py trains --train-iters iterations, or with --skip-train evaluates only",
     _names("--eval-only --inference --use-dataset-only")),
    ("not implemented: the vocabulary is the tokenizer's own (--tokenizer-file, --vocab-file); add tokens to the "
     "tokenizer file", _names("--tokenizer-special-tokens")),
    ("not implemented: Megatron's YAML config has its own keys; --config FILE.yaml takes flag names as keys",
     _names("--yaml-cfg")),
)


# ---- a no-op at one value ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class AtValue:
    """Accepted with no effect where `accepts(value, settings)` holds, refused elsewhere."""
    accepts: Callable[[Any, Mapping[str, Any]], bool]
    no_effect: str      # the reason, at the no-op value
    refused: str        # the reason and what to use, at any other value


def _equals(*values: Any) -> Callable[[Any, Mapping[str, Any]], bool]:
    def accepts(value: Any, settings: Mapping[str, Any]) -> bool:
        given = value if isinstance(value, list) else [value]
        return bool(given) and all(item in values for item in given)
    return accepts


def _matches(value_of: Callable[[Mapping[str, Any]], Any]) -> Callable[[Any, Mapping[str, Any]], bool]:
    """Accepts the value the settings already imply (or None, Megatron's "derive it"); without the
    settings (an error about unknown flags comes before the preset is read) it cannot tell, and accepts."""
    def accepts(value: Any, settings: Optional[Mapping[str, Any]]) -> bool:
        return value is None or settings is None or value == value_of(settings)
    return accepts


NO_PIPELINE_SPLIT = ("a pipeline split or schedule not implemented: with --pipeline-model-parallel-size > 1 the layers "
                     "split evenly over the stages (--decoder-first/last-pipeline-num-layers for an uneven first/last "
                     "stage, --account-for-embedding/loss-in-pipeline-split to count those as layers, "
                     "--num-layers-per-virtual-pipeline-stage or --num-virtual-stages-per-pipeline-rank for "
                     "interleaving); drop the flag, or run --pipeline-model-parallel-size 1")


def _without_pipeline(value: Any, settings: Optional[Mapping[str, Any]]) -> bool:
    """A split or schedule knob has no effect without stages and is refused with them: accepted before the
    settings are known (an error about unknown flags comes first)."""
    return settings is None or settings.get("pipeline_model_parallel_size", 1) == 1


NO_MOE = ("not implemented: the mixture of experts here is Megatron-LM's --num-experts (Megatron-Core's MoE layer, "
          "gpt/moe/); --num-experts-switch 1 is accepted: one expert is the dense model")
NOT_IN_MOE = ("not implemented in the MoE layer here (Megatron-Core's router, balancing losses, capacity and shared "
              "experts are, gpt/moe/): drop the flag")


def is_deepspeed_moe_launch(num_experts, generation: Optional[str], deepspeed: bool) -> bool:
    """A Megatron-DeepSpeed launch (its --deepspeed switch, and flags that fit that fork best) means DeepSpeed-MoE
    by --num-experts: its gating (top-1 by default, a capacity factor of 1, --moe-loss-coeff 0.1) on every
    --expert-interval-th layer (default 2; megatron/model/transformer.py there), not Megatron-Core's router. (Our
    own flags that the fork shares, such as --zero-stage, alone do not make a launch the fork's.)"""
    return bool(largest_expert_count(num_experts) and deepspeed and generation is not None
                and "deepspeed" in generation)


def _without_moe(value: Any, settings: Optional[Mapping[str, Any]]) -> bool:
    """A MoE knob that is not implemented changes nothing on a dense model and is refused with experts."""
    return settings is None or largest_expert_count(settings.get("num_experts")) is None
DENSE = "one expert is the dense model; the MoE loss coefficients then have no effect"


def _router_padding_allowed(value: Any, settings: Optional[Mapping[str, Any]]) -> bool:
    """Megatron-Core's TransformerConfig.__post_init__ (core_v0.13 on) raises without FP8 ("fp8 must be specified
    when moe_router_padding_for_fp8 is True") and with the allgather or alltoall_seq dispatcher ("... dispatcher
    does not support moe_router_padding_for_fp8"), experts or not."""
    if settings is None:
        return True
    return settings.get("fp8") is not None and settings.get("moe_token_dispatcher_type") not in ("allgather",
                                                                                                 "alltoall_seq")


# megatron/core/transformer/moe/moe_utils.py pad_routing_map: each expert's column of the routing map gains its first
# (-count mod 16) unrouted tokens (32 for MXFP8), at routing weight 0 (the router's dense probs are 0 there), so
# that TEGroupedMLP can skip TE's Fp8Padding (skip_routed_expert_padding); the aux losses and the expert-bias counts
# read the map before it (router.py). The FP8 experts here always pad each expert's rows to that multiple, with
# zero rows as Fp8Padding does (parallel/fp8/grouped.py); tests/gpt/test_moe_router_padding.py checks both give
# the same outputs and gradients outside FP8.
ROUTER_PADDING = AtValue(
    _router_padding_allowed,
    "each expert's rows padded to a multiple of the FP8 alignment (16, 32 for MXFP8), which the FP8 experts here "
    "always do, with zero rows (TE's Fp8Padding); Megatron pads with tokens routed at weight 0 instead, the same "
    "outputs and gradients but for FP8 rounding where one scale spans the padding: tensorwise and delayed "
    "scaling's input amax, blockwise and MXFP8's weight-gradient blocks along the tokens",
    "Megatron-Core refuses it without FP8 and with the allgather (or alltoall_seq) token dispatcher: add "
    "--fp8-format, use --moe-token-dispatcher-type alltoall or flex, or drop the flag")


def _fp32_run(value: Any, settings: Optional[Mapping[str, Any]]) -> bool:
    """--fp32-residual-connection casts the residual stream to fp32 (megatron/core/transformer/transformer_layer.py
    @ d98e8a64): the identity in an fp32 run."""
    return settings is None or not (settings.get("bf16") or settings.get("fp16"))


def _null_tokenizer_eod(value: Any, settings: Optional[Mapping[str, Any]]) -> bool:
    """Megatron-LM reads --null-tokenizer-eod-id only for NullTokenizer (megatron/core/tokenizers/utils/
    build_tokenizer.py @ d98e8a64), whose end-of-document id here is --vocab-size (data/tokenizer.py)."""
    return (settings is None or settings.get("tokenizer_type") != "NullTokenizer"
            or value == settings.get("vocab_size"))


# --spec's values that name Megatron-Core's hybrid stack (hybrid_layer_specs.py @ d98e8a64: mamba_stack_spec =
# hybrid_stack_spec; megatron/core/models/mamba/mamba_layer_specs.py re-exports them)
HYBRID_STACK_SPECS = tuple((module, name) for module in ("megatron.core.models.hybrid.hybrid_layer_specs",
                                                         "megatron.core.models.mamba.mamba_layer_specs")
                           for name in ("hybrid_stack_spec", "mamba_stack_spec"))
HYBRID_STACK = ("Megatron-Core's hybrid stack of attention, Mamba, MLP and MoE layers: here the blocks "
                "--hybrid-layer-pattern chooses")


def _with_pattern(value: Any, settings: Optional[Mapping[str, Any]]) -> bool:
    """--is-hybrid-model says the launch's model is --hybrid-layer-pattern's."""
    return settings is None or settings.get("hybrid_layer_pattern") is not None


def _hybrid_stack_spec(value: Any, settings: Optional[Mapping[str, Any]]) -> bool:
    return tuple(value or ()) in HYBRID_STACK_SPECS and _with_pattern(value, settings)


MODELOPT = ("ModelOpt's quantized export is not implemented (Megatron-LM's megatron/post_training): use the default, "
            "or run it with Megatron-LM and nvidia-modelopt")

AT_VALUE: dict[str, AtValue] = {
    "--export-model-type": AtValue(_equals("GPTModel"), "ModelOpt's default model type, a GPT, as here", MODELOPT),
    "--export-kv-cache-quant": AtValue(_equals("none"), "no KV-cache quantization, ModelOpt's default", MODELOPT),
    "--export-real-quant-cfg": AtValue(_equals("None"), "no real quantization, ModelOpt's default", MODELOPT),
    "--num-experts-switch": AtValue(_equals(1), DENSE, NO_MOE),
    **{option: AtValue(_without_moe, "mixture-of-experts knob: no effect on a dense model (no --num-experts, or 1)",
                       NOT_IN_MOE) for option in _names("""
        --moe-expert-rank-capacity-factor --moe-apply-probs-on-input --moe-combine-bwd-dtype
        --moe-dispatch-fwd-dtype --moe-enable-routing-replay --moe-extended-tp --moe-input-jitter-eps
        --moe-latent-size --moe-mlp-glu-interleave-size --moe-pad-experts-for-cuda-graph-inference
        --moe-paged-stash --moe-paged-stash-buffer-size-factor-cpu --moe-paged-stash-buffer-size-factor-cuda
        --moe-paged-stash-page-size --moe-router-force-biased --moe-router-quantile-balancing-ema
        --moe-routing-trace-capture-hidden-states --moe-routing-trace-capture-logits
        --moe-routing-trace-dump-weights --moe-routing-trace-max-training-iters --moe-routing-trace-path
        --moe-shared-expert-glu-interleave-size --moe-single-grouped-bias --moe-single-grouped-weight
        --moe-use-grouped-tensor
        --expert-tensor-parallel-num-weight-shards --gtp-expert-remat-nccl-ub""")},
    "--moe-router-padding-for-fp8": ROUTER_PADDING,
    "--moe-router-padding-for-quantization": ROUTER_PADDING,  # its name since core_v0.16 (FP4 too, not built here)
    "--enable-expert-tensor-parallelism": AtValue(_without_moe, "mixture-of-experts knob: no effect on a dense "
                                                                "model (no --num-experts, or 1)",
                                                  "not implemented: experts are not tensor-parallel here"),
    **{option: AtValue(_without_pipeline, "pipeline parallelism's split or schedule knob: no effect without "
                                          "stages (--pipeline-model-parallel-size 1)", NO_PIPELINE_SPLIT)
       for option in _names("""
        --pipeline-model-parallel-split-rank
        --standalone-embedding-stage --pp-partition-method
        --enable-zbh1-pipeline --enable-zbh1-exact-semantics""")},
    **{option: AtValue(_equals(False, None), "off: the MTP layers run as Megatron-Core's default, as here",
                       "not implemented: the MTP layers (--mtp-num-layers, gpt/mtp.py) run as Megatron-Core's "
                       "default: no detached heads, hidden-state mixing, standalone stage, repeated layer or "
                       "hybrid pattern; drop the flag")
       for option in _names("""--mtp-detach-heads --mtp-hsm --mtp-hybrid-override-pattern --mtp-standalone
                               --mtp-use-repeated-layer""")},
    # Megatron-LM's pretrain_hybrid.py builds the stack --spec names (hybrid_builders.py @ d98e8a64); its launches
    # name Megatron-Core's own (docs/user-guide/hybrid-model-migration.md), whose layers the pattern chooses
    "--spec": AtValue(_hybrid_stack_spec, HYBRID_STACK, "not implemented: the blocks here are built from the model "
                      "flags; --spec is accepted only as Megatron-Core's hybrid stack (" + " or ".join(
                          " ".join(spec) for spec in HYBRID_STACK_SPECS[::3]) + ") beside --hybrid-layer-pattern"),
    "--is-hybrid-model": AtValue(_with_pattern, "names the model --hybrid-layer-pattern builds",
                                 "a hybrid model is built here from --hybrid-layer-pattern (`*-` and `*E` blocks): "
                                 "give the pattern"),
    "--remote-device": AtValue(_equals("none"), "no offload, as here",
                               "ZeRO-Offload is not implemented (on the roadmap): use --zero-stage 3 over more GPUs"),
    "--weight-decay-incr-style": AtValue(_equals("constant"), "a constant --weight-decay, as here",
                                         "not implemented: the weight decay is a constant --weight-decay"),
    "--vocab-extra-ids": AtValue(_equals(0), "no extra vocabulary ids, as here",
                                 "not implemented: the vocabulary is the tokenizer's own"),
    "--num-unique-layers": AtValue(_matches(lambda s: s["num_layers"]), "every layer unique, as here",
                                   "not implemented: parameter sharing between layers"),
    "--fp32-residual-connection": AtValue(
        _fp32_run, "the residual stream is fp32 already in an fp32 run (no --bf16 or --fp16)",
        "not implemented: the residual stream follows --bf16 or --fp16 (Megatron-LM keeps it, and the embedding's "
        "output, in fp32); run without it"),
    "--null-tokenizer-eod-id": AtValue(
        _null_tokenizer_eod, "read only by --tokenizer-type NullTokenizer, whose end-of-document id here is "
                             "--vocab-size",
        "not implemented: with --tokenizer-type NullTokenizer the end-of-document id is --vocab-size"),
    "--embedding-init-method-std": AtValue(_matches(lambda s: s["init_method_std"]),
                                           "the same std as --init-method-std",
                                           "not implemented: embeddings are drawn with --init-method-std"),
}


AT_VALUE.update({option: AtValue(_equals(*values), no_effect, refused)
                 for option, (values, no_effect, refused) in FORK_AT_VALUE.items()})


# ---- lookup -------------------------------------------------------------------------------------------------

NO_EFFECT_CLASS, REFUSED_CLASS, AT_VALUE_CLASS = "no-effect", "refused", "at-value"


def _table() -> dict[str, tuple[str, str]]:
    table: dict[str, tuple[str, str]] = {}

    def put(option: str, kind: str, reason: str) -> None:
        if option in table:
            raise ValueError(f"{option} is classified twice ({table[option][0]} and {kind})")
        table[option] = (kind, reason)

    for reason, options in NO_EFFECT + FORK_NO_EFFECT:
        for option in options:
            put(option, NO_EFFECT_CLASS, reason)
    for reason, options in REFUSED + FORK_REFUSED:
        for option in options:
            put(option, REFUSED_CLASS, reason)
    for option, at_value in AT_VALUE.items():
        put(option, AT_VALUE_CLASS, at_value.no_effect)
    return table


CLASS_OF: dict[str, tuple[str, str]] = _table()
