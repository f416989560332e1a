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
# WIDE=1 trains the wider pair instead (docs/world-models.md "A wider pair"): per family a new
# language model of TEXT_LAYERS x TEXT_HEADS / TEXT_KV_HEADS (6 x 8 / 4 unless set) with the bundled
# model's trained vision, on the grow-honest curriculum. STAGE/<family>/ may be empty (the run starts
# there) or hold a CPU run's init/ and checkpoint.pt (it resumes); the whole finished folder comes
# back, since its config is not the bundled one.
set -uo pipefail
cd "$(dirname "$0")/.."
stage="$1"; out="$2"; minutes="${3:-12}"; wall="${4:-6}"
python="$(command -v python || command -v python3)"
export PYTHONUNBUFFERED=1
families=(qwen2_5_vl llava_onevision)
mkdir -p "$stage"
pids=()
for family in "${families[@]}"; do
  wide=()
  if [ "${WIDE:-0}" = 1 ]; then
    wide=(--text-layers "${TEXT_LAYERS:-6}" --text-heads "${TEXT_HEADS:-8}" --text-kv-heads "${TEXT_KV_HEADS:-4}"
          --vision-from "streamcache_ros/models/world-$family" --curriculum grow-honest --lr 3e-4 --seed 4)
  fi
  "$python" scripts/train_world_model.py --family "$family" --stages streams --resume ${wide[@]+"${wide[@]}"} \
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
  if [ "${WIDE:-0}" = 1 ]; then
    finished=("$stage/$family/out/"*)
  else
    finished=("$stage/$family/out/model.safetensors" "$stage/$family/out/training.json")
  fi
  cp "${finished[@]}" "$out/$family/" 2>/dev/null || { echo "$family: no finished model"; status=1; }
  grep '"event": "streams done"' "$stage/$family/train.log" | tail -1
done
exit $status
