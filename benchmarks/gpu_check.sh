#!/usr/bin/env bash
# The prepared GPU check (issue 25, item 7): one script a machine with one NVIDIA GPU runs in
# under 8 minutes. It builds a Qwen2-shaped model locally (Qwen2.5-0.5B's width, 4 layers, no hub),
# then, each part timed and recorded in $OUT/gpu_check.json (default benchmarks/results/):
#   1. trains coord_par2 for a few steps on the GPU with the transformers backend, in bf16;
#   2. the same under torchrun with FSDP at world size 1 (strategy=fsdp, nccl);
#   3. where SGLang is installed: launches it on the GPU and trains a few steps with the weights
#      synced over NCCL (rollout.sglang.sync=distributed), recording the sync time.
# Each part that cannot run (no GPU, no SGLang) is recorded as skipped with why; the script never
# hangs (every part has a timeout). Run: bash benchmarks/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" MPLBACKEND=Agg
WORK=$(mktemp -d -t srpo-gpu-check.XXXXXX)
STEPS=${STEPS:-4}

"$PY" - "$WORK" <<'EOF'
import sys, torch
from pathlib import Path
from transformers import Qwen2Config, Qwen2ForCausalLM
from srpo_graph.models.tiny import ensure_tiny_model, load_tokenizer
work = Path(sys.argv[1])
tok = load_tokenizer(str(ensure_tiny_model(work / "tiny")))
cfg = Qwen2Config(vocab_size=len(tok), hidden_size=896, intermediate_size=4864, num_hidden_layers=4,
                  num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=4096,
                  tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
torch.manual_seed(0)
Qwen2ForCausalLM(cfg).save_pretrained(work / "qwen")
tok.save_pretrained(work / "qwen")
print("gpu_check: built", work / "qwen")
EOF

part() {  # name, timeout seconds, command...
  local name=$1 limit=$2; shift 2
  local t0; t0=$(date +%s.%N)
  timeout "$limit" "$@" >"$WORK/$name.log" 2>&1
  local rc=$?
  echo "{\"part\": \"$name\", \"rc\": $rc, \"seconds\": $(echo "$(date +%s.%N) - $t0" | bc)}" >>"$WORK/parts.jsonl"
  echo "gpu_check: $name rc=$rc (log $WORK/$name.log)"
}

COMMON=(--steps "$STEPS" "rollout.models={tiny = \"$WORK/qwen\"}" rollout.device=cuda rollout.dtype=bfloat16
        rollout.tasks_per_step=16 rollout.samples=8 eval.every=0 logging.tensorboard=false logging.plots=false
        checkpoint.every=0)
part transformers_bf16 150 "$PY" -m srpo_graph.cli train workflows/coord_par2.wf --run-dir "$WORK/run1" "${COMMON[@]}"
part fsdp_world1 150 "$PY" -m torch.distributed.run --standalone --nproc_per_node=1 -m srpo_graph.train \
  workflows/coord_par2.wf --run-dir "$WORK/run2" strategy=fsdp "${COMMON[@]}"
if "$PY" -c "import sglang" >/dev/null 2>&1; then
  part sglang_nccl_sync 240 "$PY" -m srpo_graph.cli train workflows/coord_par2.wf --run-dir "$WORK/run3" \
    "${COMMON[@]}" rollout.backend=sglang rollout.sglang.launch=gpu rollout.sglang.sync=distributed
else
  echo '{"part": "sglang_nccl_sync", "rc": null, "skipped": "sglang is not installed"}' >>"$WORK/parts.jsonl"
fi

"$PY" - "$WORK" "$OUT/gpu_check.json" <<'EOF'
import json, sys, torch
from pathlib import Path
work, out = Path(sys.argv[1]), Path(sys.argv[2])
parts = [json.loads(l) for l in (work / "parts.jsonl").read_text().splitlines()]
for p, run in zip(parts, ("run1", "run2", "run3")):
    rows = [json.loads(l) for l in (work / run / "metrics.jsonl").read_text().splitlines()] if (work / run / "metrics.jsonl").exists() else []
    if rows:
        last = rows[-1]
        p["step_seconds"] = sum(r.get("time/step", 0.0) for r in rows[1:]) / max(1, len(rows) - 1)
        p["sync_seconds"] = sum(r.get("time/sync", 0.0) for r in rows[1:]) / max(1, len(rows) - 1)
        p["gen_tokens_per_second"] = last.get("throughput/gen_tokens_per_s")
        p["train_tokens_per_second"] = last.get("throughput/train_tokens_per_s")
        p["peak_gpu_mib"] = last.get("throughput/peak_gpu_mib")
        p["reward_first_last"] = [rows[0].get("reward"), last.get("reward")]
record = {"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
          "torch": torch.__version__, "parts": parts}
out.write_text(json.dumps(record, indent=1) + "\n")
print(json.dumps(record, indent=1))
EOF
