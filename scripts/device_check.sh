#!/usr/bin/env bash
# The check to run the day a GPU is lent (issue 26): installs the cuda extras (MLX's and JAX's CUDA 12
# builds) into a fresh virtual environment, then, within 8 minutes on one GPU, runs
#   1. the profile of the built-in LM, once per framework (workbench.launch.profile.profile_model);
#   2. the single-device step (a 1-rank run, workbench.launch.driver.run_training) and its peak memory held
#      to 10% of the prediction made from that profile (runs.profile_estimate.estimate_with_profile), its step time
#      beside the profile's (compute of the micro-batch + the update);
#   3. MLX against JAX: the same LM's training step, compiled, on the device, in one process each;
# and prints one summary table. Exit status: 0 when every peak is held, 1 when one is not, 2 on a setup error.
#
#   bash scripts/device_check.sh                       # on the GPU machine: fresh venv, cuda extras, the check
#   DEVICE=cpu bash scripts/device_check.sh            # a quick dry run on a CPU (fresh venv, CPU extras)
#   DEVICE=cpu PYTHON=python3 bash scripts/device_check.sh   # the dry run in an environment already set up
#
# Settings (environment): DEVICE gpu|cpu (default gpu); CUDA 12|13, the CUDA build to install (default 12: the
# extra `cuda`; 13: `cuda13`, for a driver with CUDA 13's libraries); PYTHON an interpreter to use as it is (no venv, no
# install); VENV where to make the venv (default: a temporary folder, removed at exit); BUDGET_S the check's
# bound in seconds (default 480: 8 minutes; the install is not counted); OUT the run store (default: temporary).
# A GPU machine without the package index (the lent H100 of 2026-11-28): PYTHON=python3 with its own JAX, and
# mlx + mlx-cuda-13 unpacked into that Python's site-packages (libmlx's RPATH finds the CUDA libraries beside it),
# ipyparallel and its needs as wheels on PYTHONPATH, the repository there too. mlx-cuda-13's wheel is 90 MB.
# On a JAX rank the launch plan picks the CPU (its gloo backend sets JAX_PLATFORMS=cpu), so JAX's device
# numbers are those of step 3; step 2's JAX row says which device it ran on.
set -euo pipefail
cd "$(dirname "$0")/.."
DEVICE="${DEVICE:-gpu}"
BUDGET_S="${BUDGET_S:-480}"
case "$DEVICE" in gpu|cpu) ;; *) echo "device_check: DEVICE=$DEVICE: choose gpu or cpu" >&2; exit 2 ;; esac
case "${CUDA:-12}" in 12) cuda_extra=cuda ;; 13) cuda_extra=cuda13 ;; *) echo "device_check: CUDA=$CUDA: choose 12 or 13" >&2; exit 2 ;; esac
case "$BUDGET_S" in ''|*[!0-9]*) echo "device_check: BUDGET_S=$BUDGET_S: a whole number of seconds" >&2; exit 2 ;; esac
scratch="$(mktemp -d -t device-check.XXXXXX)"
trap 'rm -rf "$scratch"' EXIT

if [ -n "${PYTHON:-}" ]; then
  command -v "$PYTHON" >/dev/null || { echo "device_check: PYTHON=$PYTHON: no such interpreter" >&2; exit 2; }
  PY="$PYTHON"
  echo "device_check: using $PY as it is (no install)"
else
  venv="${VENV:-$scratch/venv}"
  python3 -m venv "$venv" || { echo "device_check: cannot make a virtual environment at $venv" >&2; exit 2; }
  PY="$venv/bin/python"
  # The package index must answer before anything is installed: one small query, bounded.
  if ! timeout 60 "$PY" -m pip index versions mlx-lm >/dev/null 2>"$scratch/index.err"; then
    echo "device_check: the package index cannot be reached (pip index versions mlx-lm failed or took over 60 s):" >&2
    tail -n 3 "$scratch/index.err" >&2
    echo "device_check: this check installs MLX and JAX from PyPI; give the machine the index, or PYTHON=..." >&2
    exit 2
  fi
  if [ "$DEVICE" = gpu ]; then extras="$cuda_extra,notebook"; else extras="mlx,mlx-lm,jax,notebook"; fi
  echo "device_check: installing .[$extras] into $venv (pins: constraints.txt)"
  t0=$SECONDS
  if ! timeout 900 "$PY" -m pip install -q -e ".[$extras]" -c constraints.txt >"$scratch/install.log" 2>&1; then
    echo "device_check: pip install -e .[$extras] failed; its last lines:" >&2
    tail -n 15 "$scratch/install.log" >&2
    exit 2
  fi
  echo "device_check: installed in $((SECONDS - t0)) s"
fi

OUT="${OUT:-$scratch/runs}"
# JAX would take 75% of the GPU at start; the MLX ranks share that GPU.
export DEVICE OUT XLA_PYTHON_CLIENT_PREALLOCATE=false
set +e
timeout --kill-after=30 "$BUDGET_S" "$PY" - <<'PY'
import os, statistics, sys, time, traceback
from functools import partial


def _error(kind, value, tb):  # an error in the check is a setup error (2), not a peak not held (1)
    traceback.print_exception(kind, value, tb)
    sys.stderr.flush()
    os._exit(2)


sys.excepthook = _error
device, root = os.environ["DEVICE"], os.environ["OUT"]
t_start = time.perf_counter()


def fail(why: str) -> None:
    print(f"device_check: {why}", file=sys.stderr)
    sys.exit(2)


import mlx.core as mx
import jax
import numpy as np

mlx_device = str(mx.default_device())
jax_platform = jax.devices()[0].platform
if device == "gpu":
    if "gpu" not in mlx_device:
        fail(f"DEVICE=gpu, but MLX runs on {mlx_device} (is mlx[cuda12] installed, and a CUDA 12 driver there?)")
    if jax_platform != "gpu":
        fail(f"DEVICE=gpu, but JAX sees {jax.devices()} (is jax[cuda12] installed, and a CUDA 12 driver there?)")
else:
    mx.set_default_device(mx.cpu)

from workbench.launch.driver import run_training
from workbench.launch.profile import profile_model
from workbench.models.init import LMConfig
from workbench.runs.estimate import spec_from_row
from workbench.runs.profile_estimate import estimate_with_profile
from workbench.runs.spec import RunSpec
from workbench.runs.tables import load_runs

# The LM: a 0.2B-parameter model on a GPU (fp32 AdamW, about 3 GB held), a toy on the CPU dry run.
if device == "gpu":
    model, batch, steps = dict(vocab_size=32768, seq_len=512, dim=1024, num_layers=8, num_heads=16, mlp_dim=4096), 8, 6
else:
    model, batch, steps = dict(vocab_size=256, seq_len=64, dim=64, num_layers=2, num_heads=4, mlp_dim=128), 4, 4
rows, held = [], True
frameworks = os.environ.get("FRAMEWORKS", "mlx jax").split()


def row(*r):  # kept for the summary, and printed at once: a check stopped by BUDGET_S still shows what it got
    rows.append(r)
    print("device_check row:", "  ".join(str(c) for c in r), f"({time.perf_counter() - t_start:.0f} s)", flush=True)


def mb(x):
    return "-" if x is None else f"{x / 2**20:,.1f}"


def held_run(fw):  # the profile, then a 1-rank run whose peak is held to 10% of the profile's prediction
    global held
    spec = RunSpec(framework=fw, strategy="ddp", num_ranks=1, steps=steps, global_batch=batch, model=model)
    profile = profile_model(spec, root, refresh=True)
    row(*(fw, "profile", mlx_device if fw == "mlx" else "cpu", "cost", f"{profile.cost_s:.1f} s",
                 f"peak rss {mb(profile.cost_peak_rss_bytes)} MiB", "", ""))
    outcome = run_training(spec, root, step_timeout_s=120.0)
    if outcome.status != "done":
        fail(f"the {fw} single-device run ended {outcome.status}: {outcome.error}")
    loaded = load_runs(root)
    run = loaded.runs[loaded.runs.run_id == outcome.run_id].iloc[0]
    fields = spec_from_row(run)
    predicted = estimate_with_profile(fields, profile, run.get("model_shapes")).total_bytes
    (rank,) = run["summary.ranks"]
    measured = rank["measured_memory"]["peak"]
    ratio = measured / predicted
    ok = abs(ratio - 1) <= 0.10
    held &= ok
    where = mlx_device if fw == "mlx" else "cpu (gloo rank)"
    row(*(fw, "1-rank peak", where, "MiB", mb(predicted), mb(measured), f"{ratio:.3f}",
                 "within 10%" if ok else "NOT within 10%"))
    steps_df = loaded.steps[loaded.steps.run_id == outcome.run_id]
    step_s = statistics.median(steps_df[steps_df.step >= 1].step_time_s)
    predicted_s = profile.compute_s_at(batch) + profile.update_s
    row(*(fw, "1-rank step", where, "ms", f"{predicted_s * 1e3:,.1f}", f"{step_s * 1e3:,.1f}",
                 f"{step_s / predicted_s:.3f}", "shown"))


def compiled_steps():  # MLX against JAX: the same LM's step (AdamW), compiled, on the device, one process each.
    global params
    from workbench.models.init import init_lm_params

    config = LMConfig(**model)
    params = init_lm_params(config, 0)
    tokens = np.random.default_rng(0).integers(0, model["vocab_size"], (batch, model["seq_len"] + 1)).astype(np.int32)


    def timed(step, n=5):
        step()  # compile and warm up
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)


    import mlx.nn as nn
    import mlx.optimizers as optim

    from workbench.models.mlx_lm import MLXLM, lm_loss, load_params

    m = MLXLM(config)
    load_params(m, params)
    opt = optim.AdamW(learning_rate=1e-4)
    grad_fn = nn.value_and_grad(m, lm_loss)
    x, y = mx.array(tokens[:, :-1]), mx.array(tokens[:, 1:])


    mlx_state = [m.state, opt.state]


    @partial(mx.compile, inputs=mlx_state, outputs=mlx_state)
    def mlx_update(x, y):
        loss, grads = grad_fn(m, x, y)
        opt.update(m, grads)
        return loss


    def mlx_step():
        mx.eval(mlx_update(x, y), mlx_state)


    mx.reset_peak_memory()
    mlx_s = timed(mlx_step)
    mlx_peak = mx.get_peak_memory()
    row(*("mlx", "step, 1 process", mlx_device, "ms", "", f"{mlx_s * 1e3:,.1f}", "", f"peak {mb(mlx_peak)} MiB"))

    import jax.numpy as jnp
    import optax

    from workbench.models.jax_lm import make_loss_fn

    jdev = jax.devices()[0] if device == "gpu" else jax.devices("cpu")[0]
    loss_fn = make_loss_fn(config)
    tx = optax.adamw(1e-4)
    jp = jax.device_put({k: jnp.asarray(v) for k, v in params.items()}, jdev)
    state = [jp, tx.init(jp)]
    batch_j = jax.device_put((jnp.asarray(tokens[:, :-1]), jnp.asarray(tokens[:, 1:])), jdev)


    @jax.jit
    def jax_update(p, s, b):
        loss, g = jax.value_and_grad(loss_fn)(p, b)
        updates, s = tx.update(g, s, p)
        return optax.apply_updates(p, updates), s, loss


    def jax_step():
        p, s, loss = jax_update(state[0], state[1], batch_j)
        jax.block_until_ready(loss)
        state[:] = [p, s]


    jax_s = timed(jax_step)
    stats = jdev.memory_stats() or {}
    jax_peak = stats.get("peak_bytes_in_use")
    where_j = f"{jdev.platform}:{jdev.id}"
    row(*("jax", "step, 1 process", where_j, "ms", "", f"{jax_s * 1e3:,.1f}", f"{jax_s / mlx_s:.2f} x mlx",
                 f"peak {mb(jax_peak)} MiB"))


# The GPU's own figures first (MLX's held run, then both frameworks' compiled steps on the device), JAX's held
# run last: its gloo rank runs on the CPU, which on the 0.2B LM takes minutes (on the H100: a 132 s profile, 5 s
# steps), so a check stopped by BUDGET_S has already printed every GPU row.
if "mlx" in frameworks:
    held_run("mlx")
compiled_steps()
if "jax" in frameworks:
    held_run("jax")

params_m = sum(int(np.prod(v.shape)) for v in params.values())
print(f"\ndevice_check summary: DEVICE={device}, LM {params_m / 1e6:.1f}M params, {batch} x {model['seq_len']} "
      f"tokens, fp32 AdamW; mlx {mx.__version__} on {mlx_device}, jax {jax.__version__} on {jax_platform}; "
      f"{time.perf_counter() - t_start:.0f} s")
head = ("framework", "check", "device", "unit", "predicted", "measured", "ratio", "verdict")
widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
for r in [head, tuple("-" * w for w in widths), *rows]:
    print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))
sys.exit(0 if held else 1)
PY
rc=$?
set -e
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
  echo "device_check: the check took longer than BUDGET_S=$BUDGET_S s and was stopped" >&2
fi
exit "$rc"
