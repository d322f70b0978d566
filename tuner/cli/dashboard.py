"""`tuner dashboard`: optuna-dashboard on a study's storage, with the trial logs and a feasible "best trial"."""

from __future__ import annotations

import ipaddress
from typing import Annotated

import typer
from optuna.storages import RDBStorage
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from tuner.cli.common import SpecArg, StorageOpt, console, context, err_console
from tuner.cli.host_check import HostCheck, allowed_names
from tuner.errors import TunerError
from tuner.store.readonly import has_optuna_schema
from tuner.store.urls import mask_url, scrub
from tuner.study.optuna_adapter import open_storage
from tuner.study.outcome import is_feasible

ARTIFACTS = "optuna-artifacts"  # the worker's FileSystemArtifactStore folder under the study's work_dir


class FeasibleBestStorage(RDBStorage):
    """Optuna's RDB storage whose best trial is the best *feasible* one (what optuna-dashboard shows as best).

    Stock `RDBStorage.get_best_trial` ignores constraints; with no feasible trial it is still used.
    """

    def get_best_trial(self, study_id: int) -> FrozenTrial:
        feasible = [
            t for t in self.get_all_trials(study_id, deepcopy=False, states=(TrialState.COMPLETE,)) if is_feasible(t)
        ]
        if not feasible:
            return super().get_best_trial(study_id)
        sign = -1.0 if self.get_study_directions(study_id)[0] == StudyDirection.MAXIMIZE else 1.0
        return min(feasible, key=lambda t: (sign * float(t.value), t.number))  # type: ignore[arg-type]


def _storage(url: str) -> FeasibleBestStorage:
    """The dashboard's storage on `url`, opened without creating tables (a one-line TunerError when not usable)."""
    if not has_optuna_schema(url):
        raise TunerError(f"storage {mask_url(url)} holds no study yet (no Optuna tables); `tuner run` creates them")
    return open_storage(url, FeasibleBestStorage, create_tables=False)  # type: ignore[return-value]


def is_loopback(host: str) -> bool:
    """Whether `host` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def dashboard(
    spec: SpecArg,
    storage: StorageOpt = None,
    host: Annotated[
        str, typer.Option("--host", help="Address to listen on (anything but loopback exposes it: no authentication).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="Port to listen on.")] = 8080,
    allow_host: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-host",
            help="Also answer requests addressed to this name (Host header); loopback names are always answered.",
        ),
    ] = None,
) -> None:
    """Serve optuna-dashboard for the study: trials, feasibility, trial logs and the tuner's study note.

    Read-only until someone edits in the browser: starting it writes nothing (the workers keep the
    note current). Requests addressed to any name but loopback, the address served on and the names
    given with `--allow-host` are refused (`tuner.cli.host_check`: DNS rebinding).
    """
    import bottle
    from optuna.artifacts import FileSystemArtifactStore
    from optuna_dashboard import wsgi

    ctx = context(spec, storage)
    served = _storage(ctx.url)
    try:
        served.get_study_id_from_name(ctx.spec.study)
    except KeyError:
        err_console.print(
            f"study {ctx.spec.study} is not in {mask_url(ctx.url)} yet; it appears once `tuner run` creates it",
            highlight=False,
            soft_wrap=True,
        )
    if not is_loopback(host):
        err_console.print(
            f"warning: optuna-dashboard has no authentication; anyone who can reach {host}:{port} can read, "
            "edit and delete studies. Prefer the default 127.0.0.1 and an SSH tunnel.",
            highlight=False,
            soft_wrap=True,
        )
    artifacts = ctx.work_dir / ARTIFACTS
    artifacts.mkdir(parents=True, exist_ok=True)
    app = HostCheck(
        wsgi(served, artifact_store=FileSystemArtifactStore(str(artifacts))), allowed_names(host, allow_host or ())
    )
    shown = f"[{host}]" if ":" in host else host
    console.print(
        f"optuna-dashboard for study {ctx.spec.study} on {mask_url(ctx.url)}: http://{shown}:{port}/dashboard/ "
        "(Ctrl-C to stop)",
        highlight=False,
        soft_wrap=True,
    )
    try:
        bottle.run(app, host=host, port=port)
    except OSError as exc:
        raise TunerError(f"cannot serve on {host}:{port}: {scrub(exc.strerror or str(exc), ctx.url)}") from exc
    except KeyboardInterrupt:
        pass
