"""`tuner db upgrade`: migrate Optuna's schema and ours."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tuner.cli.common import JsonOpt, StorageOpt, console, context, emit_json, storage_option
from tuner.errors import TunerError
from tuner.spec import make_storage_dir
from tuner.store.db import check_reachable, schema_lock, upgrade_schema
from tuner.store.urls import mask_url, normalize_url

app = typer.Typer(help="Database schema commands.", no_args_is_help=True)


@app.command("upgrade")
def upgrade(
    spec: Annotated[Path | None, typer.Argument(help="A study file naming the storage.")] = None,
    storage: StorageOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Create or migrate the database: Optuna's tables and the tuner's (tuner_alembic_version)."""
    if spec is None and not storage:
        raise TunerError("db upgrade: give a study file or --storage URL")
    url = normalize_url(storage_option(storage) or "") if spec is None else context(spec, storage).url
    assert url is not None
    make_storage_dir(url)
    check_reachable(url)
    import optuna

    from tuner.study.optuna_adapter import open_storage

    with schema_lock(url):  # two first-time upgrades at once would both create the tables
        open_storage(url, migration=True).upgrade()
        before, after = upgrade_schema(url)
    if as_json:
        emit_json({"storage": mask_url(url), "optuna": optuna.__version__, "tuner_schema": [before, after]})
    else:
        console.print(
            f"{mask_url(url)}: optuna schema {optuna.__version__}-compatible; "
            f"tuner schema {before or 'none'} -> {after}"
        )
