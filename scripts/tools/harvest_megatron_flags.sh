#!/usr/bin/env bash
# Refresh arguments/megatron/flags_harvested.json from git mirrors of the source repositories.
# megatron/post_training/arguments.py is ModelOpt's add_modelopt_args, which Megatron-LM's pretrain_gpt.py passes as
# extra_args_provider when nvidia-modelopt is installed: its flags reach the same parser.
# MIRRORS holds OWNER+NAME/repo git directories (e.g. made with `git clone --mirror`).
set -euo pipefail
MIRRORS=${MIRRORS:?set MIRRORS to the folder of OWNER+NAME/repo git mirrors}
MLM=$MIRRORS/NVIDIA+Megatron-LM/repo
MDS=$MIRRORS/microsoft+Megatron-DeepSpeed/repo
BIG=$MIRRORS/bigscience-workshop+Megatron-DeepSpeed/repo
DSE=$MIRRORS/microsoft+DeepSpeedExamples/repo
DS=$MIRRORS/microsoft+DeepSpeed/repo
# The pretraining forks that publish their launches (issue 54): llm-jp/scripts installs llm-jp's branch v4 for its
# v4 scripts and nii-geniac for v3 (pretrain/installers/*/scripts/environment.sh, PRETRAIN_MEGATRON_TAG);
# swiss-ai's scripts run its fork's main. Pai-Megatron-Patch adds its flags to Megatron's parser
# (megatron_patch/arguments.py, get_patch_args).
LLMJP=$MIRRORS/llm-jp+Megatron-LM/repo
SWISSAI=$MIRRORS/swiss-ai+Megatron-LM/repo
PAI=$MIRRORS/alibaba+Pai-Megatron-Patch/repo
# ALCF's Megatron-DeepSpeed fork (argonne-lcf/Megatron-DeepSpeed): its train_alcf.sh / ALCF/helpers.sh launch the
# AuroraGPT runs with its pretrain_gpt_alcf.py, whose flags its megatron/arguments.py defines (issue 64).
ALCF=$MIRRORS/argonne-lcf+Megatron-DeepSpeed/repo
# LOLA's Megatron-DeepSpeed fork (dice-group/LOLA, megatron/ at its root): its lola_ws/gpt scripts launch the
# fork's pretrain_gpt.py, whose --lola-enable-static-moe-gate routes each token by its language (issue 81).
LOLA=$MIRRORS/dice-group+LOLA/repo
# DeepSpeedExamples removed its Megatron forks in 127c7a10 (2023-03-30); 89ce0d5a is the last commit
# that touched them (it moved them under megatron/).
DSE_FORKS=89ce0d5a40cec1772c8673bf01c532828ce3d31d
cd "$(dirname "$0")/.."
python scripts/tools/harvest_megatron_flags.py --out arguments/megatron/flags_harvested.json \
  --source megatron-lm NVIDIA/Megatron-LM "$MLM" d98e8a64ddf34856e74b24714e3bedb2f5a39553 megatron/training/arguments.py \
  --source megatron-lm-modelopt NVIDIA/Megatron-LM "$MLM" d98e8a64ddf34856e74b24714e3bedb2f5a39553 megatron/post_training/arguments.py \
  --source megatron-lm-core_v0.15.0 NVIDIA/Megatron-LM "$MLM" core_v0.15.0 megatron/training/arguments.py \
  --source megatron-lm-23.04 NVIDIA/Megatron-LM "$MLM" 23.04 megatron/arguments.py \
  --source megatron-lm-v2.6 NVIDIA/Megatron-LM "$MLM" v2.6 megatron/arguments.py \
  --source megatron-deepspeed microsoft/Megatron-DeepSpeed "$MDS" f4157bea69f3df8c6cb66f2ebcda66ba03d1288e megatron/arguments.py \
  --source bigscience-megatron-deepspeed bigscience-workshop/Megatron-DeepSpeed "$BIG" 8387ae17c4704f6579f88a84500b535d19d7fbbf megatron/arguments.py \
  --source dse-megatron-lm microsoft/DeepSpeedExamples "$DSE" $DSE_FORKS megatron/Megatron-LM/arguments.py \
  --source dse-megatron-lm-v1.1.5-zero3 microsoft/DeepSpeedExamples "$DSE" $DSE_FORKS megatron/Megatron-LM-v1.1.5-ZeRO3/megatron/arguments.py \
  --source dse-megatron-lm-v1.1.5-3d microsoft/DeepSpeedExamples "$DSE" $DSE_FORKS megatron/Megatron-LM-v1.1.5-3D_parallelism/megatron/arguments.py \
  --source llm-jp-megatron-lm-v4 llm-jp/Megatron-LM "$LLMJP" 2cbb045ffe5ec9e5ad1e27770ca0c99414ed24df megatron/training/arguments.py \
  --source llm-jp-megatron-lm-nii-geniac llm-jp/Megatron-LM "$LLMJP" 6439bf6f852a476b443a4f6595e062fe3c7f2bd6 megatron/training/arguments.py \
  --source swiss-ai-megatron-lm swiss-ai/Megatron-LM "$SWISSAI" 81d44dbe25c22190989fa8a12284bdb8d1303b40 megatron/training/arguments.py \
  --source pai-megatron-patch alibaba/Pai-Megatron-Patch "$PAI" a098ca5acbdeaf7172ce0393fa309b39a77506db megatron_patch/arguments.py \
  --source alcf-megatron-deepspeed argonne-lcf/Megatron-DeepSpeed "$ALCF" ffa3456d68b630192fcaefcc3288bd18525b8d95 megatron/arguments.py \
  --source lola-megatron-deepspeed dice-group/LOLA "$LOLA" 7e8605c197a762c67f84777aedb50856e9a6ad55 megatron/arguments.py \
  --source deepspeed microsoft/DeepSpeed "$DS" 38327e07f6cd39b63418f60cedd1651b0be3e7c3 deepspeed/__init__.py \
  --source deepspeed-v0.13.0 microsoft/DeepSpeed "$DS" v0.13.0 deepspeed/__init__.py \
  "$@"
