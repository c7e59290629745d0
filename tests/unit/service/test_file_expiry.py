"""Files API files past their expires_after are deleted, rows and bytes, by the reaper."""

from __future__ import annotations

import os
import time
from pathlib import Path

from shellbox.sandbox import OciRuntime
from shellbox.service.containers import ContainerService
from shellbox.service.files import STALE_UPLOAD_S, FileService
from shellbox.service.models import Principal
from shellbox.settings import Settings
from shellbox.store import create_database
from shellbox.store.containers import SqlContainerStore
from shellbox.store.files import SqlContainerFileStore, SqlFileStore


def upload(files: FileService, tmp_path: Path, name: str, expires: int | None) -> str:
    src = tmp_path / name
    src.write_bytes(b"data")
    return files.create_file(Principal("p"), name, "user_data", src, 4, expires).id


async def test_the_reaper_deletes_expired_files(runtime: OciRuntime, tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path / "state", lifecycle={"files_purge_interval_s": 0})
    settings.state_dir.mkdir()
    db = create_database(settings.database_url())
    containers = ContainerService(settings, SqlContainerStore(db), runtime)
    files = FileService(settings, SqlFileStore(db), SqlContainerFileStore(db), containers)
    containers.attach(files)
    short = upload(files, tmp_path, "short.txt", 2)
    kept = upload(files, tmp_path, "kept.txt", 3600)
    forever = upload(files, tmp_path, "forever.txt", None)
    crashed = files.temp_path()
    crashed.write_bytes(b"half")
    old = time.time() - STALE_UPLOAD_S - 10
    os.utime(crashed, (old, old))
    in_flight = files.temp_path()
    in_flight.write_bytes(b"being written")

    def listed() -> set[str]:
        page, _ = files.list_files(Principal("p"), after=None, limit=10, order="asc")
        return {f.id for f in page}

    await containers.reap_once()
    assert listed() == {short, kept, forever} and files.blob_dir.joinpath(short).exists()
    time.sleep(2.1)  # expires_at is a whole second, at most 2 s from the upload
    await containers.reap_once()
    assert listed() == {kept, forever}
    assert {p.name for p in files.blob_dir.iterdir()} == {kept, forever, in_flight.name}
    db.dispose()
