"""The trial's child process: build -> quick accuracy gate -> timing -> full accuracy.

Run as `python -m tuner.worker.child JOB.json RESULT.json`. Whatever happens inside (a segfault in a
native compiler, a hang, an out-of-memory kill) ends this process only; the worker classifies it.
The current phase is written to RESULT.json.phase before each step so a crash can be attributed.
"""

from __future__ import annotations

import sys
import time
import traceback
from pathlib import Path

from tuner.backends import get_backend
from tuner.backends.base import BuildContext, BuildError, ModelInfo, RuntimeRefused
from tuner.measure.accuracy import Tolerances, compare, worst
from tuner.measure.inputs import file_hash, read_feeds
from tuner.measure.reference import load_reference
from tuner.measure.timing import TimingPolicy, measure, summarize
from tuner import job as J


def run_job(job: J.Job, result_path: Path) -> J.Result:
    """Execute one trial and return its result (also written to `result_path` as it progresses)."""
    log: list[str] = []
    res = J.Result(status=J.CRASH_EXIT)

    clock = {"t": time.perf_counter()}

    def phase(name: str) -> None:
        now = time.perf_counter()
        if res.phase:
            res.phase_s[res.phase] = now - clock["t"]
        clock["t"] = now
        res.phase = name
        result_path.write_text(res.to_json())

    backend = get_backend(job.backend)
    feeds = read_feeds(Path(job.feeds_path))
    reference = load_reference(Path(job.reference_path))
    model = ModelInfo(Path(job.model_path), {k: tuple(v) for k, v in job.input_shapes.items()}, job.options)
    ctx = BuildContext(model, Path(job.work_dir), Path(job.out_dir), feeds, time.monotonic() + job.timeout_s, log.append)
    tol = Tolerances(job.atol, job.rtol)
    try:
        phase("build")
        artifact = backend.build(job.route, ctx)
        res.build_s = artifact.build_s
        res.artifact_path = str(artifact.path)
        res.artifact_sha256 = file_hash(artifact.path)
        res.artifact_bytes = artifact.path.stat().st_size
        phase("load")
        runner = backend.load(artifact, job.route, ctx)
        phase("gate")
        gate = job.gate_samples
        gate_out = [runner.infer(f) for f in feeds[:gate]]
        per_output = compare(job.metric, gate_out, reference[:gate], tol)
        res.accuracy, res.accuracy_per_output = worst(per_output), per_output
        if res.accuracy > job.tolerance:
            res.status = J.GATE_FAILED
            res.message = f"{job.metric}={res.accuracy:.4g} > {job.tolerance:g} on the first {gate} feed(s)"
            return res
        phase("time")
        samples = measure(runner.timed(feeds[0]), TimingPolicy(job.warmup_s, job.min_repeats, job.min_duration_s))
        res.samples_ms = samples
        res.latency = summarize(samples).to_dict()
        res.timing_info = runner.timing_info()
        phase("accuracy")
        outputs = gate_out + [runner.infer(f) for f in feeds[gate:]]
        per_output = compare(job.metric, outputs, reference, tol)
        res.accuracy, res.accuracy_per_output = worst(per_output), per_output
        res.status = J.OK if res.accuracy <= job.tolerance else J.ACCURACY
        if res.status == J.ACCURACY:
            res.message = f"{job.metric}={res.accuracy:.4g} > {job.tolerance:g} on {len(feeds)} feeds"
        runner.close()
    except BuildError as exc:
        res.status, res.message = exc.failure_class, str(exc)
    except RuntimeRefused as exc:
        res.status, res.message = exc.failure_class, str(exc)
    except Exception as exc:  # any other error in build/run is this route's failure, with its class name
        res.status = J.BUILD_ERROR if res.phase == "build" else J.RUNTIME_ERROR
        res.message = f"{type(exc).__name__}: {exc}"
        log.append(traceback.format_exc())
    finally:
        res.phase_s[res.phase] = time.perf_counter() - clock["t"]
        res.log = "\n".join(log)[-20000:]
    return res


def main(argv: list[str]) -> int:
    """Entry point: run the job and write the final result."""
    job_path, result_path = Path(argv[0]), Path(argv[1])
    res = run_job(J.Job.read(job_path), result_path)
    tmp = result_path.with_suffix(".tmp")
    tmp.write_text(res.to_json())
    tmp.replace(result_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
