#!/usr/bin/env bash
# Record a CPU landscape on a many-core host in shards run side by side, each in its own copy of the study's
# folder, pinned to its own pair of cores and with its own timing lock, then merge them into one file. Routes are
# split by precision variant (`record.py --shard`), so each variant is built on one shard. ONNX Runtime's
# `intra_op_threads = 0` takes every core of the host, not the shard's two: such routes run oversubscribed here
# (record spaces that hold it on a machine like the one a study runs on, unsharded). For example:
#
#   bash bench/gpu/record_landscape.sh studies/silero_vad_landscape.toml bench/landscapes/silero_vad.json.gz 8
#
# Carried wheels (.whl/) are installed first when the host lacks this project's dependencies. Each shard's log
# (and with ARCHIVE=1 an archive of the journals and outputs) are kept under $OUT (default /tmp/landscape-shards);
# SHARD_S bounds each shard (seconds); a second call on the same host resumes the shards where they stopped.
# REDUCE_OUTPUTS=1 records with --reduce-outputs (PP-OCRv4: a reduced record of its large outputs).
set -euo pipefail
cd "$(dirname "$0")/../.."
spec="$1" out="$2" shards="$3" rounds="${ROUNDS:-2}"
reduce=()
[ -n "${REDUCE_OUTPUTS:-}" ] && reduce=(--reduce-outputs)
OUT="${OUT:-/tmp/landscape-shards}"
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site:${PWD}${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="${PWD}${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
name="$(basename "$spec" .toml)"
# one logical CPU per physical core, in pairs: no shard shares a core (or its hyperthread sibling) with another
mapfile -t pairs < <(lscpu -p=CPU,CORE,SOCKET | grep -v '^#' | sort -t, -k3,3n -k2,2n -u | cut -d, -f1 | paste -sd, |
  tr ',' '\n' | paste -d, - -)
if [ "$shards" -gt "${#pairs[@]}" ]; then
  echo "error: $shards shards need $((2 * shards)) physical cores; this host has $((2 * ${#pairs[@]}))" >&2
  exit 2
fi
folders=()
for k in $(seq 0 $((shards - 1))); do
  copy="/tmp/shard-$name-$k"
  mkdir -p "$copy"
  mkdir -p "$copy/studies" && cp -r models "$copy/" && find studies -maxdepth 1 -type f -exec cp {} "$copy/studies/" \;
  cores="${pairs[$k]}"
  (cd "$copy" && TUNER_LOCK_DIR="$copy/locks" timeout "${SHARD_S:-0}" taskset -c "$cores" python3 -m bench.landscape.record \
      "studies/$(basename "$spec")" -o "$copy/part.json.gz" --rounds "$rounds" --shard "$k/$shards" "${reduce[@]}" \
      >"$OUT/$name-shard-$k.log" 2>&1 || true) &
  folders+=("$copy/studies/.tuner/$name/landscape")
done
wait
python3 -m bench.landscape.record "$spec" -o "$out" --rounds "$rounds" "${reduce[@]}" --merge "${folders[@]}" | tail -2
# the shards' journals and outputs in one archive (to resume or merge elsewhere), when ARCHIVE=1
[ -z "${ARCHIVE:-}" ] || tar -czf "$OUT/$name-shards.tar.gz" --exclude=baseline --exclude=trial -C / "${folders[@]#/}"
