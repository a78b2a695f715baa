#!/usr/bin/env bash
# One prepared run for a CUDA machine (issue 6). From the repository root:
#
#     bash benchmarks/gpu.sh            # ~10 minutes on one H100/H200-class GPU
#     QUICK=1 bash benchmarks/gpu.sh    # ~4 minutes: fewer rounds, 1-epoch training
#
# Writes beside the CPU results, in benchmarks/results/:
#   <gpu>-imagenet-base.csv   bvit_base vs vit_base vs timm, 224px / patch 16, 1000 classes, bf16
#   <gpu>-cifar-tiny.csv      the CPU table's shape (32px / patch 4, 100 classes, tiny), bf16
#   <gpu>-train-synthetic.json / .log   a short CIFAR-100-shaped training on synthetic data
#                             (bvit_tiny, bf16, fused AdamW, train.compile=true), 1 GPU, and
#                             data-parallel over every GPU when there are several
# <gpu> is the device name in lower case (e.g. nvidia-h200).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
OUT=benchmarks/results
mkdir -p "$OUT"
QUICK=${QUICK:-0}
Q=(); EPOCHS=2; TRAIN_N=50000
if [ "$QUICK" = 1 ]; then Q=(--quick); EPOCHS=1; TRAIN_N=20000; fi

$PY - <<'EOF' || { echo "gpu.sh: no CUDA device visible; this script is for a GPU machine" >&2; exit 2; }
import sys, torch
sys.exit(0 if torch.cuda.is_available() else 1)
EOF
GPU=$($PY -c "import re, torch; print(re.sub(r'[^a-z0-9]+', '-', torch.cuda.get_device_name(0).lower()).strip('-'))")
NGPU=$($PY -c "import torch; print(torch.cuda.device_count())")
echo "== $GPU ($NGPU visible), torch $($PY -c 'import torch; print(torch.__version__)')"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader || true

echo "== 1/3 ImageNet shape: bvit_base vs vit_base vs timm (224 px, patch 16, bf16, compiled blocks too)"
$PY benchmarks/throughput.py "${Q[@]}" --img-size 224 --patch-size 16 --width base --classes 1000 --amp bf16 \
    --batch 128 --mem-batch 64 --fs-batch 64 --matmul-n 8192 --compile --tag imagenet-base --out "$OUT"

echo "== 2/3 CIFAR shape: bvit_tiny vs vit_tiny vs timm (32 px, patch 4, bf16)"
$PY benchmarks/throughput.py "${Q[@]}" --amp bf16 --batch 512 --mem-batch 256 --fs-batch 256 --matmul-n 8192 \
    --compile --tag cifar-tiny --out "$OUT"

echo "== 3/3 short CIFAR-100-shaped training on synthetic data (bvit_tiny, compile, bf16)"
RUN=$(mktemp -d)/train
DATA=(data.name=synthetic data.synthetic_size=32 data.synthetic_classes=100 data.synthetic_train=$TRAIN_N
      data.synthetic_test=10000 data.num_workers=4)
MODEL=(model.name=bvit_tiny model.patch_size=4)
TRAIN=(train.epochs=$EPOCHS train.batch_size=512 train.lr=2e-3 train.compile=true train.progress=false)
$PY -m recurvit train "${DATA[@]}" "${MODEL[@]}" "${TRAIN[@]}" --out "$RUN-1gpu" --json \
    > "$OUT/$GPU-train-synthetic.json" 2> "$OUT/$GPU-train-synthetic.log"
cat "$OUT/$GPU-train-synthetic.json"
if [ "$NGPU" -gt 1 ]; then
  $PY -m recurvit train --nproc "$NGPU" "${DATA[@]}" "${MODEL[@]}" "${TRAIN[@]}" --out "$RUN-ddp" --json \
      > "$OUT/$GPU-train-synthetic-ddp$NGPU.json" 2> "$OUT/$GPU-train-synthetic-ddp$NGPU.log"
  cat "$OUT/$GPU-train-synthetic-ddp$NGPU.json"
fi
cp "$RUN-1gpu/metrics.jsonl" "$OUT/$GPU-train-synthetic-metrics.jsonl"

echo "== tables"
for f in "$OUT/$GPU-imagenet-base.csv" "$OUT/$GPU-cifar-tiny.csv"; do
  $PY benchmarks/throughput.py --report "$f"; echo
done
