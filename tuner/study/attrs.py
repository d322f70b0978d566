"""The names of the user attributes the tuner keeps in Optuna: each declared once, here, with what it holds.

Trial attributes are written when a trial is recorded (`tuner.study.outcome`, the worker) and read by
`tuner best`, `status`, `trials`, the note, the report, racing, the confirmation and the benchmarks;
study attributes are written when a study is created and by racing, the warm start and the
confirmation. Code names them by these constants, never by a string of its own.
"""

from __future__ import annotations

# -- trial attributes: the outcome (`tuner.study.outcome.user_attrs`) -------------------------------------------
FAILURE_CLASS = "failure_class"  # the outcome's name (`tuner.job`), "" for a route that was timed
MESSAGE = "message"  # the result's one-line explanation (at most 500 characters)
PHASE = "phase"  # the child's last phase (build, gate, time, accuracy, ...)
ACCURACY = "accuracy"  # {"metric", "value", "tolerance"}: the worst value over the outputs (and shapes)
ACCURACY_PER_OUTPUT = "accuracy_per_output"  # {output name: metric value}, at most 20 outputs
LATENCY_MS = "latency_ms"  # the route's latency statistics (median, mean, p90, ...) in ms
PHASE_S = "phase_s"  # {phase: seconds} of the trial's child
BUILD_S = "build_s"  # seconds the backend took to build the engine
ARTIFACT_SHA256 = "artifact_sha256"  # the engine file's content hash (its name in the work dir's artifacts)
ARTIFACT_BYTES = "artifact_bytes"  # the engine file's size
PEAK_MEMORY_MB = "peak_memory_mb"  # what loading and running the engine added at its highest (`tuner.measure.memory`)
MEMORY_KIND = "memory_kind"  # what PEAK_MEMORY_MB measured: "host-rss" or "device"
BUILD_INFO = "build_info"  # the backend's facts about the build (JSON-safe)
FEASIBLE = "feasible"  # timed and within every constraint (the dashboard shows no constraints)
MEASURED_MS = "measured_ms"  # {"trial", "default"}: the latencies the trial's own uncontended timing measured

# -- trial attributes: the paired timing (`tuner.study.outcome.paired_attrs`; see `tuner.study.racing`) ----------
PAIRED = "paired"  # timed paired with the baseline engine in one process (ABBA blocks)
UNPAIRED = "unpaired"  # why a trial was timed alone
TIMING_STOP = "timing_stop"  # what ended the measurement: precision, cap, slow or ahead
TIMING = "timing"  # cycles, seconds, half-width, drift, warm-up, lock, priority, load and clocks of the timing
CONTENDED = "contended"  # other work kept the cores the timing needed: no standing until re-measured
SHAPES = "shapes"  # [[objective.shapes]]: per shape inputs, weight, route_ms, default_ms, speedup, ci, ...
AFFINITY = "affinity"  # the cores the timing thread was allowed, read during the timing
SPEEDUP_PAIRED = "speedup_paired"  # baseline latency / route latency from the pairing (1.0 for the baseline)
SPEEDUP_PAIRED_CI = "speedup_paired_ci"  # [low, high] of SPEEDUP_PAIRED
SPEEDUP_PAIRED_CONFIDENCE = "speedup_paired_confidence"  # the level of SPEEDUP_PAIRED_CI
BASELINE_LATENCY_MS = "baseline_latency_ms"  # the baseline engine's latency statistics measured beside the trial

# -- trial attributes: the worker -----------------------------------------------------------------------------------
SOURCE = "source"  # who proposed the route: baseline, recommended, warm-start, sampler (absent), ...
WORKER = "worker"  # the name of the worker that ran the trial
CACHE_KEY = "cache_key"  # the first 16 hex digits of the result's content key (`tuner.store.cache`)
CACHE_HIT = "cache_hit"  # the result was reused from the cache, not measured
CACHED_FROM = "cached_from"  # "study#trial" whose stored result was reused
ENVIRONMENT = "environment"  # {"backend", "version", "device"} of the worker
FAILURE_KEY = "failure_key"  # what failed: a product's key, else the route's cache key
TRIAL_WALL_S = "trial_wall_s"  # seconds from reserving the trial to recording it
OVERHEAD_S = "overhead_s"  # TRIAL_WALL_S less the child's phases: the tuner's own cost
RETRY_OF = "retry_of"  # the number of the trial whose route this one runs again
ATTEMPT = "attempt"  # which run of its route this trial is, counting the runs that ended lost
ENV_REQUEUES = "env_requeues"  # how many times the route was re-queued after environment errors
WARM_START_FROM = "warm_start_from"  # the study whose winner this warm-start trial carries over

# -- study attributes -------------------------------------------------------------------------------------------
TUNER_VERSION = "tuner_version"  # the route-tuner that created the study
BACKEND = "backend"  # the backend's name
BACKEND_VERSION = "backend_version"  # the backend's version when the study was created
DEFAULT_ROUTE = "default_route"  # the default route (the baseline's)
BUDGET = "budget"  # the trials the study may spend
PREPARATION = "preparation"  # the model preparation steps before int8 variants, with their status
MODEL_SHA256 = "model_sha256"  # the model's content hash (a warm start matches other models' studies on it)
DEVICE_KIND = "device_kind"  # the kind of device the study runs on (a warm start matches on it)
WARM_START = "warm_start"  # {"sources", "observations"}: what the warm start took from other studies
RACING = "racing"  # {"<trial number>": refined standing}: racing's re-measurements (`tuner.study.racing`)
# a racing entry's key with [[objective.shapes]]: per shape inputs, weight, speedup, ci, confidence, route_ms,
# default_ms and measurements, every paired measurement of the trial pooled shape by shape
SHAPES_REFINED = "shapes_refined"
CONFIRMATION = "confirmation"  # the end-of-study confirmation document (`tuner.worker.confirm`)
