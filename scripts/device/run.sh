#!/usr/bin/env bash
# The accelerator-machine measurements of issues 19 (GPU serving) and 17 (1,000 robots on 16 cores) as ONE
# call of the device tool (docs/benchmarks.md, "Measuring on the accelerator machine"):
#
#   scripts/device/run.sh [--dry] [STEP ...]      default: all
#     forward          benchmarks.gpu_forward: vla_300m, bf16, 2 x 224x224 cameras, batch 1/8/32/64, and the
#                      micro-batching gain at 64 sessions (issue 19)              -> $OUT/gpu_forward.json
#     capacity         bench init-weights reacher_vla, then bench run scenarios/capacity_gpu.yaml: the knee
#                      against P10's formula fed the measured forward time (19)  -> $OUT/capacity.tar.gz
#     fleet            bench run scenarios/1000_robots_wan.yaml: verdict, figures, CPU split (17)
#                                                                                 -> $OUT/fleet.tar.gz
#     forward-compile  forward with --compile (torch.compile per bucket) at batch 1/8/32/64, the plain and
#                      training-time passes (not the guided VJP's slow compile), the eager pass timed beside
#                      each in the same process; micro-batching at 64 first, the JPEG path last
#                                                                                 -> $OUT/gpu_forward_compile.json
#     capacity-compile capacity's short form, compiled as shipped (model.hyper_params.compile; the scenario named
#                      capacity_gpu_compile; steps 8/16/32/64 of 10 + 15 s, 351 s on an H100, unless CAPACITY_ARGS
#                      says otherwise; packed with capacity's)                    -> $OUT/capacity.tar.gz
#     gpu = forward capacity;  all = forward fleet capacity
#   --dry (or DEVICE_DRY=1): the same steps at a tiny size on any host, under nice: forward at the tiny
#     preset on the CPU, capacity's refusal without CUDA (exit 2 expected), fleet shrunk to 20 robots and 20 s.
#
# Always first: the machine (nvidia-smi, cores, Python, torch) into $OUT/env.txt, then the carried wheels
# (.device/wheels, made by scripts/device/wheels.sh) that this Python lacks or has older, installed into
# $DEVICE_SITE (ahead on PYTHONPATH), and an import check. A failing step never stops the next; each step's exit code, time and limit go to
# $OUT/steps.json; $OUT/summary.txt (printed last) holds the figures. $OUT gets at most 8 files (the
# device tool's limit): summary.txt steps.json env.txt console.log gpu_forward.json
# gpu_forward_compile.json capacity.tar.gz fleet.tar.gz. Reports are written under $DEVICE_WORK and packed.
#
# Time: the script ends within DEVICE_BUDGET_S (default 550 s; dry 1800). Each step gets the smaller of
# its own limit and what is left after the later steps' reserve; capacity, last in `all`, takes what is
# left: at its limit it gets SIGINT (Ctrl-C) and its sweep reports the knee of the load steps it finished.
# Environment: OUT (.device/out), DEVICE_WORK (/tmp/fleet-device), DEVICE_SITE (/tmp/fleet-device-site),
# PYTHON (python3), CAPACITY_ARGS / FLEET_ARGS (more `bench run` arguments, shell-quoted, e.g.
# CAPACITY_ARGS="--set 'sweep.values=[16, 32, 64, 128]'"), FORWARD_ARGS (more benchmarks.gpu_forward arguments, after
# the step's own, e.g. FORWARD_ARGS="--dtype bfloat16 --batches 1 64" or "--passes guided plain training_time").
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
PY=${PYTHON:-python3}
HELPER="$ROOT/scripts/device/device.py"
DRY=${DEVICE_DRY:-0}

steps=()
for arg in "$@"; do
  case $arg in
    --dry) DRY=1 ;;
    all) steps+=(forward fleet capacity) ;;
    gpu) steps+=(forward capacity) ;;
    forward|capacity|fleet|forward-compile|capacity-compile) steps+=("$arg") ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown step '$arg' (forward, capacity, fleet, forward-compile, capacity-compile, gpu, all, --dry)" >&2
       exit 2 ;;
  esac
done
[ ${#steps[@]} -eq 0 ] && steps=(forward fleet capacity)

OUT=${OUT:-$ROOT/.device/out}
WORK=${DEVICE_WORK:-/tmp/fleet-device}
SITE=${DEVICE_SITE:-/tmp/fleet-device-site}
if [ "$DRY" = 1 ]; then BUDGET=${DEVICE_BUDGET_S:-1800}; NICE="nice -n 19"; else BUDGET=${DEVICE_BUDGET_S:-550}; NICE=""; fi
mkdir -p "$OUT" "$WORK"
rm -rf "$WORK"/capacity "$WORK"/fleet "$WORK"/*.json "$WORK"/*.log
STEPS_JSON="$OUT/steps.json"; rm -f "$STEPS_JSON"
CONSOLE="$OUT/console.log"; : > "$CONSOLE"
export PYTHONPATH="$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
unset MUJOCO_GL  # the bench picks: EGL where libEGL is, else none (synthetic cameras render nothing)
START=$SECONDS

say() { echo "run.sh: $*" | tee -a "$CONSOLE"; }

# A step's limit, and reserve (the least time it is worth running with), in seconds: full size | dry.
limit_of() {
  case $1 in
    forward) [ "$DRY" = 1 ] && echo 300 || echo 240 ;;
    forward-compile) [ "$DRY" = 1 ] && echo 300 || echo 330 ;;
    capacity|capacity-compile) [ "$DRY" = 1 ] && echo 180 || echo 540 ;;
    fleet) [ "$DRY" = 1 ] && echo 900 || echo 330 ;;
  esac
}
reserve_of() {
  case $1 in
    forward) echo 90 ;; forward-compile) echo 200 ;; capacity) echo 60 ;; capacity-compile) echo 240 ;; fleet) echo 280 ;;
  esac
}

# run_logged SECONDS LOG CMD...: CMD under timeout (SIGINT at the limit, as Ctrl-C; SIGKILL 40 s later), its
# output streamed to LOG and console.log; returns CMD's exit code (124: stopped at the limit).
run_logged() {
  local limit=$1 log=$2; shift 2
  if [ "$limit" -lt 10 ]; then  # timeout 0 would mean no limit at all
    echo "no time left for: $* (${limit}s)" | tee -a "$log" >> "$CONSOLE"; return 124
  fi
  echo "\$ $*" | tee -a "$log" >> "$CONSOLE"
  local tag="$$-$RANDOM"
  DEVICE_RUN_TAG=$tag timeout -s INT -k 40 "$limit" $NICE "$@" 2>&1 | tee -a "$log" >> "$CONSOLE"
  local rc=${PIPESTATUS[0]}
  echo "(exit $rc)" | tee -a "$log" >> "$CONSOLE"
  reap "$tag" 2>&1 | tee -a "$log" >> "$CONSOLE"
  return "$rc"
}

# reap TAG: end the processes a command started that outlived it (the bench's children run in their own
# sessions, so a SIGKILL of the bench would orphan them into the next step): found by the DEVICE_RUN_TAG
# they inherited, TERM, then KILL whatever is left 5 s later.
reap() {
  local pids=() d
  for d in /proc/[0-9]*; do  # /proc/PID/environ: the environment it started with
    grep -qxz "DEVICE_RUN_TAG=$1" "$d/environ" 2>/dev/null && pids+=("${d#/proc/}")
  done
  [ ${#pids[@]} -eq 0 ] && return 0
  local what="" p
  for p in "${pids[@]}"; do what+="$p $(tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null | cut -c1-80); "; done
  echo "leftover processes, ended: $what"
  kill -TERM "${pids[@]}" 2>/dev/null
  for _ in 1 2 3 4 5; do kill -0 "${pids[@]}" 2>/dev/null || return 0; sleep 1; done
  kill -KILL "${pids[@]}" 2>/dev/null
  return 0
}

has_cuda() { "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; }

# --- always: the machine, the wheels, the imports ------------------------------------------------------------
env_report() {
  echo "date: $(date -u +%FT%TZ)  host: $(hostname)  kernel: $(uname -r)  cores: $(nproc)"
  echo "memory: $(free -g 2>/dev/null | awk '/^Mem:/ {print $2 " GiB, " $7 " GiB available"}')  load: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo 'unknown (no .git here)')  dry: $DRY  steps: ${steps[*]}  budget: ${BUDGET}s"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,utilization.gpu --format=csv
  else
    echo "nvidia-smi: not found"
  fi
  echo "python: $(command -v "$PY") $("$PY" -V 2>&1)"
  "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(),
           torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")' 2>&1
  "$PY" -c 'import torchvision; print("torchvision", torchvision.__version__)' 2>&1 | tail -1
  echo "libEGL: $(ldconfig -p 2>/dev/null | grep -c 'libEGL.so.1') entries in ldconfig"
}

install_wheels() {
  local dir="$ROOT/.device/wheels" missing
  if [ ! -d "$dir" ]; then
    echo "no $dir (scripts/device/wheels.sh makes it; name it in carry): nothing installed"
    return 1
  fi
  missing=$("$PY" "$HELPER" missing "$dir") || return 1
  if [ -z "$missing" ]; then echo "every carried wheel's distribution is already installed"; return 0; fi
  echo "installing into $SITE: $(echo "$missing" | xargs -n1 basename | tr '\n' ' ')"
  # shellcheck disable=SC2086
  "$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" $missing
}

IMPORTS=$(cat <<'PYEOF'
import importlib, os, sys
# bench.robots.models first: it chooses MuJoCo's GL backend, which mujoco reads once, at its import
names = ["bench.robots.models", "zenoh", "simplejpeg", "mujoco", "gymnasium", "cryptography", "pydantic", "toxiproxy", "pyarrow",
         "msgpack", "yaml", "psutil", "rich", "prometheus_client", "safetensors", "PIL", "requests", "torch",
         "torchvision", "wire.transport", "edge", "server.cli", "chaos.client", "bench.cli", "benchmarks.gpu_forward"]
bad = []
for n in names:
    try:
        m = importlib.import_module(n)
        print(f"  {n} {getattr(m, '__version__', '')}")
    except Exception as exc:
        bad.append(n)
        print(f"  {n} FAILED: {type(exc).__name__}: {exc}")
if "bench.robots.models" not in bad:
    import mujoco
    from bench.robots import models
    model = mujoco.MjModel.from_xml_string("<mujoco><worldbody><body><joint/><geom size='.1'/></body></worldbody></mujoco>")
    data = mujoco.MjData(model)
    mujoco.mj_step(model, data)
    print(f"  MuJoCo steps; GL {os.environ.get('MUJOCO_GL')} ({models.GL_UNAVAILABLE or 'rendering available'})")
optional = {"torchvision"}  # the GPU JPEG decode's; the CPU decoder runs without it
sys.exit(1 if set(bad) - optional else 0)
PYEOF
)

record() { "$PY" "$HELPER" record "$STEPS_JSON" "$@"; }

t0=$SECONDS
env_report > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt" >> "$CONSOLE"
{ echo "--- wheels"; install_wheels; } >> "$OUT/env.txt" 2>&1; rc_install=$?
record install $rc_install $((SECONDS - t0)) 0
t0=$SECONDS
{ echo "--- imports (PYTHONPATH=$PYTHONPATH)"; "$PY" -c "$IMPORTS"; } >> "$OUT/env.txt" 2>&1; rc_imports=$?
record imports $rc_imports $((SECONDS - t0)) 0
sed -n '/^--- wheels/,$p' "$OUT/env.txt" >> "$CONSOLE"
if has_cuda; then CUDA=1; else CUDA=0; fi
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
say "gpu ${GPU:-none}, cuda $CUDA, $(nproc) cores; install rc $rc_install, imports rc $rc_imports ($OUT/env.txt); $((SECONDS - START))s"

# --- the steps -------------------------------------------------------------------------------------------------
step_forward() {  # $1: limit, $2: forward | forward-compile
  local out="$WORK/gpu_forward.json" args=()
  [ "$2" = forward-compile ] && { out="$WORK/gpu_forward_compile.json"; args+=(--compile); }
  if [ "$DRY" = 1 ]; then
    args+=(--device cpu --preset tiny --image-size 64 --batches 1 8 --repeat 2 --warmup 1)
  elif [ "$2" = forward-compile ]; then  # a compile per batch size and pass (a replica compiled 10 in 72 s on the H100;
    # the guided VJP's, with autograd, took most of the 188 s of two sizes): the passes capacity_gpu serves, the
    # micro-batching gain at 64 first (buckets 1 and 64), then every size, the JPEG path last
    args+=(--device cuda --preset vla_300m --image-size 224 --batches 1 8 32 64 --repeat 5 --warmup 3
           --passes plain training_time --stages micro_batching forward runtime)
  else
    args+=(--device cuda --preset vla_300m --image-size 224 --batches 1 8 32 64 --repeat 10 --warmup 3)
  fi
  local extra=(); eval "extra=(${FORWARD_ARGS:-})"  # after the step's own: argparse keeps the last
  run_logged "$1" "$WORK/$2.log" "$PY" -m benchmarks.gpu_forward "${args[@]}" "${extra[@]}" --out "$out"
  local rc=$?
  [ -f "$out" ] && cp "$out" "$OUT/"
  return $rc
}

step_capacity() {  # $1: limit, $2: capacity | capacity-compile
  local deadline=$((SECONDS + $1)) log="$WORK/$2.log" rc compiled=()
  # every load step's replica compiles its buckets as it starts (72 s the first time on an H100, 11-14 s from
  # Inductor's cache after), so the short form has fewer, shorter steps; CAPACITY_ARGS, after these, still wins
  [ "$2" = capacity-compile ] && compiled=(--set name=capacity_gpu_compile --set 'servers.manifest.model.hyper_params={compile: true}'
                                           --set 'sweep.values=[8, 16, 32, 64]' --set warmup_s=10 --set duration_s=15)
  local weights="$ROOT/bench/checkpoints/reacher_vla/model.safetensors"
  if [ "$CUDA" = 1 ] && [ ! -f "$weights" ]; then
    local t=$((deadline - SECONDS)); [ $t -gt 150 ] && t=150
    run_logged $t "$log" "$PY" -m bench.cli init-weights reacher_vla || return $?
  fi
  local extra=(); eval "extra=(${CAPACITY_ARGS:-})"  # shell words: quotes work as on a command line
  run_logged $((deadline - SECONDS)) "$log" "$PY" -m bench.cli run scenarios/capacity_gpu.yaml --quiet \
    --reports "$WORK/capacity" "${compiled[@]}" "${extra[@]}"
  rc=$?
  cp "$log" "$WORK/capacity/" 2>/dev/null
  [ -d "$WORK/capacity" ] && "$PY" "$HELPER" pack "$WORK/capacity" "$OUT/capacity.tar.gz" 2>&1 | tee -a "$CONSOLE"
  return $rc
}

DRY_FLEET=(--set fleet.groups.eu.count=7 --set fleet.groups.us.count=7 --set fleet.groups.ap.count=6
           --set duration_s=20 --set warmup_s=5 --set faults.0.at=6 --set faults.0.duration=3 --set faults.1.at=12
           --set 'servers.replicas=[{id: r0, checkpoint: reacher_rtc_training_time, max_sessions: 160}, {id: r1, checkpoint: reacher_rtc_training_time, max_sessions: 160}]')

step_fleet() {  # $1: limit
  local deadline=$((SECONDS + $1)) log="$WORK/fleet.log" rc args=()
  [ "$DRY" = 1 ] && args=("${DRY_FLEET[@]}")
  local extra=(); eval "extra=(${FLEET_ARGS:-})"
  run_logged 60 "$log" "$PY" -m bench.cli run scenarios/1000_robots_wan.yaml --check "${args[@]}" "${extra[@]}"
  run_logged $((deadline - SECONDS)) "$log" "$PY" -m bench.cli run scenarios/1000_robots_wan.yaml --quiet \
    --reports "$WORK/fleet" "${args[@]}" "${extra[@]}"
  rc=$?
  cp "$log" "$WORK/fleet/" 2>/dev/null
  [ -d "$WORK/fleet" ] && "$PY" "$HELPER" pack "$WORK/fleet" "$OUT/fleet.tar.gz" 2>&1 | tee -a "$CONSOLE"
  return $rc
}

for i in "${!steps[@]}"; do
  name=${steps[$i]}
  later=0
  for next in "${steps[@]:$((i + 1))}"; do later=$((later + $(reserve_of "$next"))); done
  left=$((BUDGET - (SECONDS - START) - 20))  # 20 s: packing and the summary
  limit=$(limit_of "$name")
  [ $((left - later)) -lt "$limit" ] && limit=$((left - later))
  if [ "$limit" -lt 60 ]; then
    say "$name: skipped, ${limit}s left for it"
    record "$name" -1 0 "$limit" "skipped: ${left}s left of the budget, ${later}s reserved for later steps"
    continue
  fi
  say "$name: start (limit ${limit}s, $((SECONDS - START))s into the run)"
  t0=$SECONDS
  case $name in
    forward|forward-compile) step_forward "$limit" "$name" ;;
    capacity|capacity-compile) step_capacity "$limit" "$name" ;;
    fleet) step_fleet "$limit" ;;
  esac
  rc=$?
  note=""
  if [ "${name%-compile}" = capacity ] && [ "$CUDA" = 0 ]; then
    grep -q "needs a CUDA GPU" "$WORK/$name.log" && note="refused without CUDA (expected: exit 2)" \
      || note="no CUDA, and no refusal in the log"
  fi
  [ $rc = 124 ] && note="stopped at its limit (SIGINT)${note:+; $note}"
  record "$name" $rc $((SECONDS - t0)) "$limit" "$note"
  say "$name: rc $rc in $((SECONDS - t0))s"
done

"$PY" "$HELPER" summary "$WORK" "$STEPS_JSON" > "$OUT/summary.txt" 2>&1
echo "run.sh: done in $((SECONDS - START))s; \$OUT=$OUT: $(ls "$OUT" | tr '\n' ' ')" >> "$OUT/summary.txt"
cat "$OUT/summary.txt" | tee -a "$CONSOLE"
