"""The Python API: a study (a study file, or the same contents as a mapping) bound to its storage.

The `tuner` command is built on it: `tuner run` is `Study.run`, `tuner status` `Study.status`,
`tuner best --json` `Study.best`, `tuner trials` `Study.trials`, `tuner best --export` `Study.export`.
Errors are `tuner.errors.TunerError`s with the one-line messages the command prints; their
`exit_code` is the command's exit status (2 bad input, 3 environment, 130 interrupted).

Example (a study of the bundled model, three trials, no confirmation)::

    from tuner import Study

    study = Study.from_file("studies/efficientnet_lite0.toml")
    verdict = study.run(trials=3, confirm=False)
    print(verdict["verdict"], verdict["route"])
    for trial in study.trials():
        print(trial["number"], trial["outcome"], trial["speedup"])
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna

from tuner.errors import Interrupted, TunerError, Unavailable
from tuner.events import CONFIRMING, DONE, TRIALS, PhaseEvent, TrialWatcher
from tuner.spec import Spec, load_spec, make_storage_dir, resolve_storage, spec_from_doc
from tuner.spec.toml import dumps
from tuner.store.db import STOP, is_db_fault
from tuner.store.urls import mask_url
from tuner.study import attrs as A
from tuner.study.documents import best_document, status_document, trial_documents, verdict_document
from tuner.study.setup import Context

if TYPE_CHECKING:
    from tuner.worker.pool import Pool

__all__ = ["Callback", "Study"]

Callback = Callable[[Any], None]  # receives each TrialEvent, PhaseEvent and confirmation RoundEvent
POLL_S = 0.5  # how often a run looks at the study for finished trials (a display cadence, not synchronisation)
DICT_FILE = "study.toml"  # where a study made from a mapping is written for its workers (in its work dir)


class Study:
    """One study: what to tune (the study file) and where it is kept (the storage URL).

    Build it with `Study.from_file` or `Study.from_dict`; nothing is written until `run`. The
    reading methods (`status`, `best`, `trials`) create no file, folder or table.
    """

    def __init__(self, spec: Spec, storage: str | None = None, doc: Mapping[str, Any] | None = None) -> None:
        self.spec = spec
        self._storage_option = storage
        self._doc = doc  # a study made from a mapping: written to its work dir when it runs

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], storage: str | None = None) -> Study:
        """The study file at `path`, validated (model and data included); `storage` overrides its URL.

        >>> Study.from_file("studies/efficientnet_lite0.toml").name
        'efficientnet-lite0-cpu'
        """
        return cls(load_spec(path), storage)

    @classmethod
    def from_dict(
        cls, mapping: Mapping[str, Any], base_dir: str | os.PathLike[str], storage: str | None = None
    ) -> Study:
        """A study file's contents as a mapping (the TOML's tables as dicts); paths are relative to `base_dir`.

        >>> model = {"path": "models/efficientnet_lite0.onnx", "inputs": {"images": {"shape": [1, 3, 224, 224]}}}
        >>> doc = {"study": {"name": "lite0"}, "model": model, "backend": {"name": "onnxruntime"},
        ...        "accuracy": {"metric": "top1_mismatch", "tolerance": 0.0}, "run": {"budget": 4}}
        >>> Study.from_dict(doc, ".").name
        'lite0'
        """
        doc = {k: dict(v) if isinstance(v, Mapping) else v for k, v in mapping.items()}
        return cls(spec_from_doc(doc, Path(base_dir) / "<mapping>"), storage, doc)

    @property
    def name(self) -> str:
        """The study's name ([study] name)."""
        return self.spec.study

    @property
    def storage(self) -> str:
        """The storage URL: the `storage` argument, else $TUNER_STORAGE, the study file's, SQLite in the work dir."""
        return resolve_storage(self.spec, self._storage_option)

    def context(self) -> Context:
        """The study bound to its storage, as the workers and commands see it."""
        return Context(self.spec, self.storage)

    def run(
        self,
        trials: int | None = None,
        workers: int | None = None,
        gpus: Iterable[str] | None = None,
        timeout_s: float | None = None,
        confirm: bool = True,
        callbacks: Iterable[Callback] = (),
        *,
        reconfirm: bool = False,
        confirm_rounds: int | None = None,
        confirm_top_k: int = 3,
        confirm_confidence: float = 0.95,
    ) -> dict[str, Any]:
        """Run (or resume) the study until its total budget is spent, confirm the winner, return the verdict.

        `trials` is the study's TOTAL budget (not "N more"); `workers` CPU worker processes, or one
        per GPU id in `gpus`; `timeout_s` (default [run] timeout_s) a wall-clock cap after which the
        trials in flight are re-queued and the study ends unconfirmed with a verdict on what it has.
        A confirmation that still holds for the study as it is stands (`reconfirm` measures again).
        Every callback gets each event as it happens (`tuner.events`). Returns `best()`'s document,
        with its keys about no route while nothing is feasible.
        """
        from tuner.study.gc import enforce_cap
        from tuner.study.setup import claim_device, prepare
        from tuner.worker.pool import Pool, study_server

        emit = _emitter(callbacks)
        ctx = self._writable_context()
        budget = trials or ctx.spec.run.budget
        gpu_list = [str(g).strip() for g in gpus or () if str(g).strip()]
        timeout = timeout_s if timeout_s is not None else ctx.spec.run.timeout_s
        started = time.monotonic()
        server = None if gpu_list else study_server(ctx.backend, ctx.spec.run.sampler)  # its imports overlap `prepare`
        study = prepare(ctx)
        if not gpu_list:
            claim_device(ctx)  # CPU workers share this machine: refuse other hardware once, here
        study.set_user_attr(A.BUDGET, budget)
        pool = Pool(ctx.spec.path, ctx.url, budget, workers or ctx.spec.run.workers, gpu_list, server)
        emit(
            PhaseEvent(
                TRIALS,
                f"study {ctx.spec.study} on {mask_url(ctx.url)}: budget {budget}, "
                f"{len(gpu_list) or pool.workers} worker(s)",
            )
        )
        watcher = TrialWatcher(study, budget, len(gpu_list) or pool.workers)
        timed_out = False
        with _sigterm_interrupts():
            pool.start()
            try:
                while pool.alive():
                    time.sleep(POLL_S)
                    _each(emit, _poll(watcher))
                    if timeout is not None and time.monotonic() - started > timeout:
                        timed_out = True
                        emit(PhaseEvent(TRIALS, f"timeout: {timeout:g} s passed; the trials in flight are re-queued"))
                        pool.stop()
                        break
            except KeyboardInterrupt:
                _exit_on_second_signal(pool)
                pool.stop()
                raise Interrupted("stopped: the trials in flight were re-queued; run again to resume") from None
            finally:
                codes = pool.wait()
                try:
                    _each(emit, _poll(watcher))
                except Exception as exc:  # after a stop the database may not answer (a frozen server)
                    if not (STOP.is_set() and is_db_fault(exc)):
                        raise
        failed = [c for c in codes if c]
        if failed and not timed_out:
            message = f"{len(failed)} worker(s) exited with an error (statuses {codes})"
            if set(failed) == {TunerError.exit_code}:  # each worker refused the study file as given (its line said why)
                raise TunerError(message)
            raise Unavailable(message)
        if confirm and not timed_out:
            self._confirm(ctx, study, emit, reconfirm, confirm_rounds, confirm_top_k, confirm_confidence)
        collected = enforce_cap(ctx, study)  # after confirmation: the routes it measured are kept
        if collected:
            emit(PhaseEvent(DONE, f"gc: {collected}"))
        doc, head = verdict_document(ctx, study)
        emit(PhaseEvent(DONE, head.sentence))
        return doc

    def _confirm(
        self,
        ctx: Context,
        study: optuna.Study,
        emit: Callback,
        reconfirm: bool,
        rounds: int | None,
        top_k: int,
        confidence: float,
    ) -> None:
        """Re-measure the top routes against the default in fresh processes, unless the stored confirmation holds."""
        from tuner.study.note import update_note
        from tuner.worker.confirm import confirm, is_current

        if not reconfirm and is_current(ctx, study, top_k, confidence, rounds):
            emit(
                PhaseEvent(
                    CONFIRMING, "the stored confirmation holds for the study as it is (reconfirm to measure again)"
                )
            )
            return
        emit(PhaseEvent(CONFIRMING, f"re-measuring up to {top_k} candidate(s) against the default route"))
        with _sigterm_interrupts():  # so the child in flight is killed, not orphaned
            try:
                doc = confirm(
                    ctx,
                    study,
                    rounds,
                    top_k,
                    confidence,
                    log=lambda line: emit(PhaseEvent(CONFIRMING, line)),
                    on_round=emit,
                )
            except KeyboardInterrupt:
                raise Interrupted("confirmation interrupted; run again to confirm") from None
        update_note(study)
        emit(PhaseEvent(CONFIRMING, str(doc["message"])))

    def status(self) -> dict[str, Any]:
        """Counts by state, the best so far, the speedup, elapsed time and the verdict (`tuner status --json`)."""
        ctx = self.context()
        return status_document(ctx, ctx.load())

    def best(self) -> dict[str, Any]:
        """The verdict and the route it is about (`tuner best --json`); TunerError while nothing is feasible."""
        ctx = self.context()
        return best_document(ctx, ctx.load())[0]

    def trials(self) -> list[dict[str, Any]]:
        """Every trial with its outcome, route changes, speedup and message (`tuner trials --json`)."""
        return trial_documents(self._load())

    def export(self, directory: str | os.PathLike[str], trial: int | None = None) -> str:
        """Write what the verdict says (the confirmed winner, else the default route), or feasible trial `trial`,
        as a deployable folder (`tuner best --export DIR [--trial N]`); one line saying what was written."""
        from tuner.export import export_choice, export_trial

        ctx = self.context()
        study = ctx.load()
        doc, head = best_document(ctx, study)
        return export_trial(ctx, doc, export_choice(study, head, trial), Path(directory))

    def _load(self) -> optuna.Study:
        return self.context().load()

    def _writable_context(self) -> Context:
        """The context of a run: a study from a mapping is written to its work dir first (its workers read it)."""
        if self._doc is not None:
            path = self.spec.work_dir / DICT_FILE
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(dumps(_absolute(self._doc, self.spec)))
            self.spec, self._doc = load_spec(path), None
        ctx = self.context()
        make_storage_dir(ctx.url)
        return ctx


def _absolute(doc: Mapping[str, Any], spec: Spec) -> dict[str, Any]:
    """`doc` with its paths made absolute, so that the file reads the same from any folder."""
    out = {k: dict(v) for k, v in doc.items()}
    out["model"]["path"] = str(spec.model.path)
    out["study"]["work_dir"] = str(spec.work_dir)
    if spec.data.file is not None:
        out["data"]["file"] = str(spec.data.file)
    return out


def _emitter(callbacks: Iterable[Callback]) -> Callback:
    listeners = list(callbacks)

    def emit(event: Any) -> None:
        for listener in listeners:
            listener(event)

    return emit


def _poll(watcher: TrialWatcher) -> list[Any]:
    """The trials finished since the last look; none while the database is unreachable (the workers retry)."""
    from tuner.store.db import is_db_fault

    try:
        return watcher.poll()
    except Exception as exc:
        if not is_db_fault(exc):
            raise
        return []


def _each(emit: Callback, events: Iterable[Any]) -> None:
    for event in events:
        emit(event)


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt here, as Ctrl-C does (a container stop stops the run cleanly)."""

    def interrupt(signum: int, frame: Any) -> None:
        STOP.set()  # this process's database waits end soon too, even those of the clean-up (a frozen server)
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set a signal handler
        return
    previous = signal.signal(signal.SIGTERM, interrupt)
    previous_int = signal.signal(signal.SIGINT, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)


def _exit_on_second_signal(pool: Pool) -> None:
    """From now on a SIGTERM or Ctrl-C tells the workers again (a second signal ends them at once) and exits."""
    if threading.current_thread() is not threading.main_thread():
        return

    def now(signum: int, frame: Any) -> None:
        pool.stop()
        os._exit(130)

    signal.signal(signal.SIGTERM, now)
    signal.signal(signal.SIGINT, now)
