#!/usr/bin/env bash
# Finish both world models' stream stage on a lent CUDA machine, side by side, from checkpoints
# staged in STAGE: STAGE/<family>/init/ (the model folder) and STAGE/<family>/checkpoint.pt (made
# by scripts/slim_checkpoint.py, small enough to travel). Each family trains in its own process
# with a larger batch and worker processes rendering the streams (docs/world-models.md, "Training
# on a lent GPU"). What comes back, per family, in OUT_DIR/<family>/: model.safetensors,
# training.json, train.log.
#   scripts/gpu_train.sh STAGE OUT_DIR [MINUTES] [WALL_MINUTES]
# MINUTES is the streams stage's whole schedule in wall minutes on the GPU (the checkpoint resumes
# at its own progress through it); WALL_MINUTES caps the run. DEVICE=cpu tries it on a CPU.
set -uo pipefail
cd "$(dirname "$0")/.."
stage="$1"; out="$2"; minutes="${3:-12}"; wall="${4:-6}"
python="$(command -v python || command -v python3)"
export PYTHONUNBUFFERED=1
families=(qwen2_5_vl llava_onevision)
pids=()
for family in "${families[@]}"; do
  "$python" scripts/train_world_model.py --family "$family" --stages streams --resume \
    --work "$stage/$family" --out "$stage/$family/out" --device "${DEVICE:-cuda}" \
    --minutes "$minutes" --wall-minutes "$wall" --accumulate "${ACCUMULATE:-4}" --workers "${WORKERS:-6}" \
    --threads 2 --eval-every 2 --eval-streams 16 >"$stage/$family.stdout" 2>&1 &
  pids+=($!)
done
status=0
for i in "${!families[@]}"; do
  wait "${pids[$i]}" || { echo "${families[$i]}: the trainer failed"; tail -20 "$stage/${families[$i]}.stdout"; status=1; }
done
for family in "${families[@]}"; do
  mkdir -p "$out/$family"
  cp "$stage/$family/train.log" "$out/$family/" 2>/dev/null
  cp "$stage/$family/out/model.safetensors" "$stage/$family/out/training.json" "$out/$family/" 2>/dev/null \
    || { echo "$family: no finished model"; status=1; }
  grep '"event": "streams done"' "$stage/$family/train.log" | tail -1
done
exit $status
