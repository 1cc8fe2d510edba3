#!/usr/bin/env bash
# The txl bench tables on a CUDA GPU, in under 10 minutes (under 20 with the host CPU rows: each command's
# timeout bounds it): bfloat16 autocast, batch sized to the device; torch.compile against eager in float32;
# FlexAttention against the biased kernel; int8 (eager and compiled) and ONNX rows on the host CPU.
#
#   bash benchmarks/gpu.sh            # writes benchmarks/results/<gpu>.json, <gpu>-eval-speedup.json,
#                                     # <gpu>-eval-speedup-enwik8-large.json, <gpu>-compile.json,
#                                     # <gpu>-flex-attention.json and, unless CPU_ROWS=0,
#                                     # <gpu>-host-int8.json and <gpu>-host-export.json
#
# Uses the python on PATH (or $PYTHON) with a CUDA build of torch; txl from this checkout (src/).
# Against transformers' TransfoXL and GPT-2 when transformers==4.35.2 is importable, txl alone otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
name=$("$PY" -c "import torch, re; assert torch.cuda.is_available(), 'no CUDA device'; \
print(re.sub(r'[^a-z0-9]+', '-', torch.cuda.get_device_name(0).lower()).strip('-'))")
# a batch that keeps the device busy: 64 sequences per 40 GiB of memory, at least 16, at most 256
batch=$("$PY" -c "import torch; g = torch.cuda.get_device_properties(0).total_memory / 2**30; \
print(max(16, min(256, int(g / 40) * 64)))")
vs=()
if "$PY" -c "import transformers, sys; sys.exit(transformers.__version__ != '4.35.2')" 2>/dev/null; then
    vs=(--vs hf)
fi
mkdir -p benchmarks/results
echo "device: $name, batch $batch, ${vs[*]:-txl alone}"
timeout 200 "$PY" -m txl bench "${vs[@]}" --device cuda --dtype bfloat16 --batch-size "$batch" --repeats 5 \
    --json "benchmarks/results/$name.json" --force
timeout 45 "$PY" -m txl bench --eval-speedup --device cuda --lengths 128,256,512,800,1800,2800,3800 \
    --json "benchmarks/results/$name-eval-speedup.json" --force
# the paper's Table 9 with its large enwik8/text8 model (24 layers, d_model 1024)
timeout 55 "$PY" -m txl bench --eval-speedup --model enwik8-large --device cuda --repeats 3 \
    --json "benchmarks/results/$name-eval-speedup-enwik8-large.json" --force
# torch.compile against eager (float32; training and evaluation segments of bench-small; docs/compile.md)
timeout 150 "$PY" -m txl bench --compile --device cuda --repeats 5 \
    --json "benchmarks/results/$name-compile.json" --force
# the relative position term as FlexAttention's score_mod (benchmarks/flex_attention.py), compiled, against txl's biased kernel
timeout 120 "$PY" benchmarks/flex_attention.py --device cuda --json "benchmarks/results/$name-flex-attention.json" \
    || echo "flex attention row failed; the rows after it still run"
# int8 weights and the ONNX decoder are CPU kernels (no CUDA int8 kernel in txl; ONNX Runtime's CPU provider):
# their rows on this host's CPU, unless CPU_ROWS=0 (export rows need the export extra)
if [ "${CPU_ROWS:-1}" = 1 ]; then
    timeout 360 "$PY" -m txl bench --quantize int8 --json "benchmarks/results/$name-host-int8.json" --force \
        || echo "host int8 row failed"
    if "$PY" -c "import onnxruntime, onnxscript" 2>/dev/null; then
        timeout 240 "$PY" -m txl bench --export --json "benchmarks/results/$name-host-export.json" --force \
            || echo "host export row failed"
    fi
fi
