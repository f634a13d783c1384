#!/usr/bin/env bash
# strata's training steps against a GPT-2 and AdamW written in PyTorch
# (tools/torch-ref check, docs/model.md): the small default model with
# W, G, P, M and V on nvme (streamed through host and vram), W in fp32 and
# bf16, then one step from a transformers-style file and greedy generation
# past the context; then GPT-2's vocabulary (50257: the chunked
# cross-entropy's ragged last chunk) with 3 heads of 32 and W streamed from
# host. Then two LLaMA shapes against tools/torch_llama.py: GQA (4 heads
# over 2) with Qwen2's q/k/v biases, a tied head and llama3 rope scaling,
# with every state on nvme; MQA with head_dim != dim/heads, an untied head
# and linear rope scaling; then a LLaMA on a shard with a loss mask, two
# micro-batches a step, against labels -100 (tools/torch-ref check --mask);
# last GPT-2 and a LLaMA on short documents packed in rows with attention
# kept within each, against a block-diagonal causal mask (--packing).
# Exits 77 (skipped) where python3 has no PyTorch.
set -u
ref=$1 strata=$2 work=$3
"$ref" check --strata "$strata" --work "$work" --threads 1 \
	--strata-args "--offload-params nvme --offload-optim nvme" || exit $?
echo
"$ref" check --strata "$strata" --work "$work" --threads 1 --precision fp32 \
	--model layers=2,dim=96,heads=3,vocab=50257,ctx=48 \
	--strata-args "--gpu-mem 128M --host-mem 128M --offload-params host" || exit $?
echo
"$ref" check --strata "$strata" --work "$work" --threads 1 \
	--model llama:layers=2,dim=64,heads=4,kv-heads=2,ffn=96,vocab=256,ctx=64,bias=1,tied=1,rope-theta=500000,rope-scaling=llama3:8:1:4:16 \
	--strata-args "--offload-params nvme --offload-optim nvme" || exit $?
echo
"$ref" check --strata "$strata" --work "$work" --threads 1 \
	--model llama:layers=2,dim=64,heads=4,kv-heads=1,head-dim=32,ffn=80,vocab=300,ctx=64,tied=0,rope-scaling=linear:4 || exit $?
echo
# a loss mask (docs/finetune.md): labels -100 where the shard's mask is 0,
# the loss the mean over the step's counted targets of 2 micro-batches
"$ref" check --strata "$strata" --work "$work" --threads 1 --mask \
	--model llama:layers=2,dim=64,heads=4,kv-heads=2,ffn=96,vocab=256,ctx=64,tied=0
rc=$?
[ $rc = 0 ] || exit $rc
echo
# packed documents kept apart (strata train --samples documents --packing
# isolated): a block-diagonal causal mask over the same rows, GPT-2 and
# LLaMA, fp32 (tools/torch-ref check --packing)
"$ref" check --strata "$strata" --work "$work" --threads 1 --packing || exit $?
echo
"$ref" check --strata "$strata" --work "$work" --threads 1 --packing \
	--model llama:layers=2,dim=64,heads=4,kv-heads=2,ffn=96,vocab=256,ctx=64,tied=0
