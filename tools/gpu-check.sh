#!/usr/bin/env bash
# The GPU measurements and tests of lbsgd on a node that keeps its own torch and may have no
# network (docs/gpu.md, "Checking a GPU node"). Each step is one command, a few minutes long:
#
#   tools/gpu-check.sh setup        install lbsgd (no dependencies) and pydantic into this Python,
#                                   from .whl/ when it exists (`make wheels` fills it elsewhere)
#   tools/gpu-check.sh tests OUT    the CUDA tests (pytest -m cuda): OUT/cuda_tests.txt
#   tools/gpu-check.sh train OUT    trainer vs bare loop, ResNet-50 on fake ImageNet held on the GPU,
#                                   fp32/bf16/fp16 eager, plain BN, ghost BN (groups of 32) and 4
#                                   accumulated micro-batches: OUT/train_<gpu>.json
#   tools/gpu-check.sh compiled OUT the same in bf16 under torch.compile, one repeat (each side
#                                   compiles anew): OUT/train_compiled_<gpu>.json
#   tools/gpu-check.sh ghost OUT    ghost BN's one pass against a kernel per group and plain BN,
#                                   ResNet-50 at micro-batch 256 in 8 groups of 32, fp32/bf16/fp16,
#                                   eager and compiled (target: the train step's ghost-BN rows at
#                                   0.9 of the bare loop or more): OUT/ghost_bn_<gpu>_<prec>_<compile>.json
#   tools/gpu-check.sh data OUT     loaders against compute: CIFAR-10 (on the device) and ImageNet
#                                   JPEGs at 8 and 15 workers (lbsgd data fake): OUT/data_*.json
#   tools/gpu-check.sh noise OUT    what noise_scale=true costs on the GPU: OUT/noise_scale_<gpu>.json
#   tools/gpu-check.sh plan OUT     lbsgd plan's predicted step time beside runs of ResNet-50 on fake
#                                   ImageNet at batches 32 to 512 (target: within 15%):
#                                   OUT/plan_step_time_<gpu>.json
#   tools/gpu-check.sh studies OUT  a profile's committed runs again on the GPU, from their own
#                                   config.yaml (PROFILE, default fashion-long; CONFIGS, the folder
#                                   holding them, default results/PROFILE), JOBS at a time (default
#                                   cores - 2), smallest batch first, EXTRA's key=value pairs added
#                                   (e.g. micro_batch=auto): OUT/studies/<study>/<run>/
#
# PYTHON (default python3) is the node's interpreter, the one holding its torch. STEPS and
# REPEATS shorten train and compiled (default 50 and 2), NOISE_STEPS and NOISE_REPEATS noise
# (default 100 and 9), for a node lent by the minute; the JSON records what was run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
step=${1:-}
out=${2:-}

need_out() {
  if [ -z "$out" ]; then
    echo "tools/gpu-check.sh $step: give the folder the results go to (OUT)" >&2
    exit 2
  fi
  mkdir -p "$out"
}

# the matrix's layouts, model and data (docs/benchmarks.md): ResNet-50, micro-batch 256
common=(--layouts plain,ghost_bn,accum --accum 4 --steps "${STEPS:-50}" device=cuda model=resnet50 dataset=fake
  channels_last=true micro_batch=256 bn_batch=32 batch_size=256 threads=0)

gpu_slug() {
  "$PY" -c 'import torch; from lbsgd.bench.train import device_slug; print(device_slug(torch.device("cuda")))'
}

case "$step" in
  setup)
    if [ -d .whl ]; then
      "$PY" -m pip install --quiet --no-index --find-links .whl pydantic
      "$PY" -m pip install --quiet --no-index --find-links .whl --no-deps -e .
    else
      "$PY" -m pip install --quiet 'pydantic>=2.5'
      "$PY" -m pip install --quiet --no-deps -e .
    fi
    "$PY" -c 'import torch, lbsgd.entry; print(f"lbsgd on torch {torch.__version__}, CUDA: {torch.cuda.is_available()}")'
    ;;
  tests)
    need_out
    # the CUDA tests start lbsgd in subprocesses: they use the Python that setup installed into.
    # Only the files that hold CUDA tests are collected: others import what a node need not have
    # (nbformat, papermill, radon)
    mapfile -t files < <(grep -l "pytest.mark.cuda" tests/test_*.py)
    set +e
    "$PY" -m pytest -m cuda -v -p no:cacheprovider --durations=0 "${files[@]}" 2>&1 |
      tee "$out/cuda_tests.txt"
    rc=${PIPESTATUS[0]}
    set -e
    exit "$rc"
    ;;
  train)
    need_out
    gpu=$(gpu_slug)
    "$PY" -m lbsgd bench train --matrix --precisions fp32,bf16,fp16 --compile false \
      --repeats "${REPEATS:-2}" "${common[@]}" --out "$out/train_$gpu.json"
    ;;
  compiled)
    need_out
    gpu=$(gpu_slug)
    "$PY" -m lbsgd bench train --matrix --precisions bf16 --compile true --repeats "${REPEATS:-1}" \
      "${common[@]}" --out "$out/train_compiled_$gpu.json"
    ;;
  ghost)
    need_out
    gpu=$(gpu_slug)
    for prec in fp32 bf16 fp16; do
      for comp in false true; do
        "$PY" -m lbsgd bench ghost-bn --groups 8 --steps "${STEPS:-50}" --repeats "${REPEATS:-2}" \
          device=cuda model=resnet50 dataset=fake channels_last=true micro_batch=256 threads=0 \
          precision="$prec" compile="$comp" --out "$out/ghost_bn_${gpu}_${prec}_$comp.json"
      done
    done
    ;;
  data)
    need_out
    data=${DATA:-/tmp/lbsgd-fake}
    [ -d "$data/imagenet" ] || "$PY" -m lbsgd data fake imagenet "$data/imagenet" --train 2560 --val 50
    [ -d "$data/cifar10" ] || "$PY" -m lbsgd data fake cifar10 "$data/cifar10"
    "$PY" -m lbsgd bench data --dataset cifar10 --data-dir "$data/cifar10" --workers 0 \
      model=resnet depth=20 batch_size=128 bn_batch=128 device=cuda --out "$out/data_cifar10.json"
    for w in 8 15; do
      "$PY" -m lbsgd bench data --dataset imagenet --data-dir "$data/imagenet" --workers "$w" \
        model=resnet50 precision=bf16 channels_last=true batch_size=256 bn_batch=32 \
        micro_batch=256 device=cuda --out "$out/data_imagenet_w$w.json"
    done
    ;;
  noise)
    need_out
    gpu=$(gpu_slug)
    "$PY" -m lbsgd bench noise --steps "${NOISE_STEPS:-100}" --repeats "${NOISE_REPEATS:-9}" \
      channels_last=true device=cuda \
      --out "$out/noise_scale_$gpu.json"
    ;;
  plan)
    need_out
    "$PY" tools/plan_step_time.py "$out" --batches "${PLAN_BATCHES:-32,64,128,256,512}" \
      device=cuda model=resnet50 dataset=fake channels_last=true bn_batch=32 threads=0
    ;;
  studies)
    need_out
    profile=${PROFILE:-fashion-long}
    configs=${CONFIGS:-results/$profile}
    jobs=${JOBS:-$(($(nproc) - 2))}
    mkdir -p "$out/studies"
    # the smallest batches run longest: started first, they set the wall time
    find "$configs" -name config.yaml -exec grep -H '^batch_size:' {} + | sort -t: -k3n | cut -d: -f1 |
      PY="$PY" OUT="$out/studies" EXTRA="${EXTRA:-}" xargs -P "$jobs" -I{} sh -c \
        '"$PY" -m lbsgd train -c "$1" device=cuda out_dir="$OUT" $EXTRA >"$OUT/$(basename "$(dirname "$1")").log" 2>&1' _ {}
    ;;
  *)
    sed -n '2,26p' "$0" >&2
    exit 2
    ;;
esac
