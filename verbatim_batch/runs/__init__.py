"""Run folders: staged writes and the atomic commit (``folder``), manifests (``manifest``), and a root of
runs with a ``current`` pointer (``current``)."""

from .current import (
    CURRENT_FILE,
    CURRENT_LINK,
    RUNS_DIR,
    current_run,
    current_table,
    prune_runs,
    publish,
    set_current,
)
from .folder import (
    BINDING_FILE,
    CARRIED_PREFIX,
    WRITES_DIR,
    OutputBusyError,
    OutputExistsError,
    RunDir,
    SettingsChangedError,
    acquire_lock,
    claim_composite,
    committed_run,
    completed_keys,
    file_stats,
    live_files,
    read_writes,
    record_keys,
    record_write,
    release_lock,
    safe_run_id,
    staged,
    write_manifest,
)
from .manifest import (
    MANIFEST_FILE,
    build_manifest,
    committed_table_dir,
    expect_run,
    jsonable,
    load_manifests,
    manifest_config,
    new_run_id,
    read_manifest,
    read_table,
    validate_manifest,
    versions,
)

__all__ = [
    "BINDING_FILE", "CARRIED_PREFIX", "CURRENT_FILE", "CURRENT_LINK", "MANIFEST_FILE", "RUNS_DIR", "WRITES_DIR",
    "OutputBusyError", "OutputExistsError", "RunDir", "SettingsChangedError", "acquire_lock", "build_manifest",
    "claim_composite", "committed_run", "committed_table_dir", "completed_keys", "current_run", "current_table",
    "expect_run", "file_stats", "jsonable", "live_files", "load_manifests", "manifest_config", "new_run_id",
    "prune_runs", "publish", "read_manifest", "read_table", "read_writes", "record_keys", "record_write",
    "release_lock", "safe_run_id", "set_current", "staged", "validate_manifest", "versions", "write_manifest",
]
