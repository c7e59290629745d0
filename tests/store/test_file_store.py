"""FileStore and ContainerFileStore contracts, on SQLite and PostgreSQL."""

from __future__ import annotations

from shellbox.store import Stores
from shellbox.store.records import ContainerFileRecord, FileRecord


def test_files_expiry_purpose_and_tenancy(stores: Stores) -> None:
    f = stores.files
    f.insert(FileRecord("file-1", "p", "a.txt", "user_data", 3, 100, None))
    f.insert(FileRecord("file-2", "p", "b.txt", "assistants", 4, 101, 200))
    f.insert(FileRecord("file-3", "q", "c.txt", "user_data", 5, 102, None))
    assert f.get("p", "file-2", now=150) == FileRecord(
        "file-2", "p", "b.txt", "assistants", 4, 101, 200
    )
    assert f.get("p", "file-2", now=200) is None  # expired: gone for the API
    assert f.get("q", "file-1", now=150) is None
    rows, more = f.page("p", purpose=None, now=150, after=None, limit=10, order="asc")
    assert [r.id for r in rows] == ["file-1", "file-2"] and not more
    rows, _ = f.page("p", purpose="user_data", now=150, after=None, limit=10, order="asc")
    assert [r.id for r in rows] == ["file-1"]
    assert f.purge_expired(199) == []
    assert f.purge_expired(200) == ["file-2"]
    f.delete("file-1")
    assert f.page("p", purpose=None, now=0, after=None, limit=10, order="asc") == ([], False)


def test_container_file_upsert_keeps_the_id_of_a_path(stores: Stores) -> None:
    cf = stores.container_files
    first = cf.upsert(
        ContainerFileRecord("cfile_1", "c", "a.txt", 1, 100, "user", 10), force_source=True
    )
    assert first == ContainerFileRecord("cfile_1", "c", "a.txt", 1, 100, "user", 10)
    # Another writer (another server with a stale index) indexes the same path under a new id:
    # the stored id, creation time and (unless forced) source stay.
    again = cf.upsert(
        ContainerFileRecord("cfile_2", "c", "a.txt", 7, 300, "assistant", 20), force_source=False
    )
    assert again == ContainerFileRecord("cfile_1", "c", "a.txt", 7, 100, "user", 20)
    forced = cf.upsert(
        ContainerFileRecord("cfile_3", "c", "a.txt", 8, 400, "assistant", 30), force_source=True
    )
    assert (forced.id, forced.source, forced.bytes) == ("cfile_1", "assistant", 8)
    cf.upsert(
        ContainerFileRecord("cfile_4", "c", "b.txt", 2, 100, "assistant", 1), force_source=False
    )
    cf.upsert(
        ContainerFileRecord("cfile_5", "d", "a.txt", 2, 100, "assistant", 1), force_source=False
    )
    assert [r.id for r in cf.for_container("c")] == ["cfile_1", "cfile_4"]
    assert cf.get("c", "cfile_1") is not None and cf.get("d", "cfile_1") is None
    rows, more = cf.page("c", after=None, limit=1, order="desc")
    assert [r.id for r in rows] == ["cfile_4"] and more
    cf.delete(["cfile_4"])
    cf.delete([])
    assert [r.id for r in cf.for_container("c")] == ["cfile_1"]
    cf.delete_container("c")
    assert cf.for_container("c") == [] and len(cf.for_container("d")) == 1
