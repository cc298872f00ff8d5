"""The stack's own S3-compatible server (S3Proxy): its files and configuration, the refusals
and start failures (with stand-in processes, no JVM), and one real server that delta-rs writes
a table to and reads it back from."""

from __future__ import annotations

import re
import socket
import stat
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from dispatch.settings import Settings, load_settings
from dispatch.stack.jars import JarError
from dispatch.stack.object_store import ObjectStore
from dispatch.stack.ports import free_port
from dispatch.stack.process import ProcessError, is_running
from dispatch.storage import storage_options

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def served(var: Path, port: int, **storage: object) -> Settings:
    values: dict[str, object] = {
        "serve": True,
        "endpoint_url": f"http://127.0.0.1:{port}",
        "access_key_id": "stack-key",
        "secret_access_key": "stack-secret",
        "bucket": "tables",
    }
    return load_settings(paths={"var": str(var)}, storage={**values, **storage})


def test_its_files_live_under_var(tmp_path: Path) -> None:
    store = ObjectStore(served(tmp_path, 19321))
    assert store.data == tmp_path / "object-store"
    assert store.bucket_dir == tmp_path / "object-store" / "tables"
    assert store.process.pid_file == tmp_path / "run" / "object-store.pid"
    assert store.log_file == tmp_path / "logs" / "object-store.log"
    assert store.properties_file.parent == tmp_path / "run"
    assert (store.name, store.address, store.host, store.port) == (
        "object-store", "http://127.0.0.1:19321", "127.0.0.1", 19321
    )  # fmt: skip
    assert store.running() is None and store.pid is None


def test_the_properties_name_the_endpoint_credentials_and_atomic_backend(tmp_path: Path) -> None:
    store = ObjectStore(served(tmp_path, 19321, endpoint_url="http://localhost:19321/"))
    store.write_properties()
    lines = store.properties_file.read_text().splitlines()
    assert lines == [
        "s3proxy.endpoint=http://localhost:19321",
        "s3proxy.authorization=aws-v2-or-v4",
        "s3proxy.identity=stack-key",
        "s3proxy.credential=stack-secret",
        "jclouds.provider=filesystem-nio2",
        f"jclouds.filesystem.basedir={tmp_path / 'object-store'}",
    ]
    # It holds the secret key.
    assert stat.S_IMODE(store.properties_file.stat().st_mode) == 0o600


def test_a_store_that_is_not_served_is_not_started(tmp_path: Path) -> None:
    store = ObjectStore(load_settings(paths={"var": str(tmp_path)}))
    with pytest.raises(ProcessError, match=r"storage\.serve is false"):
        store.start()
    assert not store.process.pid_file.exists() and not store.data.exists()


def test_without_java_the_error_says_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("dispatch.stack.object_store.shutil.which", lambda _name: None)
    store = ObjectStore(served(tmp_path, free_port()))
    with pytest.raises(ProcessError, match=r"Java is not installed.*bootstrap"):
        store.start()
    assert not store.process.pid_file.exists()


def test_without_the_jar_the_jar_error_says_so(tmp_path: Path) -> None:
    settings = served(tmp_path, free_port())
    cache = tmp_path / "cache"
    settings = settings.model_copy(
        update={"paths": settings.paths.model_copy(update={"cache": cache})}
    )
    with pytest.raises(JarError, match="s3proxy jars are not in"):
        ObjectStore(settings).start()


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The command `start` runs, in place of S3Proxy's JVM (set by each test)."""
    command = list(SLEEPER)
    monkeypatch.setattr(ObjectStore, "command", lambda _self: command)
    return command


def test_a_taken_port_is_refused_before_anything_starts(
    tmp_path: Path, stand_in: list[str]
) -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        store = ObjectStore(served(tmp_path, other.getsockname()[1]))
        with pytest.raises(ProcessError, match="is taken by another process"):
            store.start()
    assert not store.process.pid_file.exists()


def test_a_server_that_exits_during_start_is_reported_with_its_log(
    tmp_path: Path, stand_in: list[str]
) -> None:
    stand_in[:] = [sys.executable, "-c", "import sys; print('no such bucket dir'); sys.exit(3)"]
    store = ObjectStore(served(tmp_path, free_port()))
    with pytest.raises(ProcessError, match="exited") as error:
        store.start()
    assert str(store.log_file) in str(error.value) and "no such bucket dir" in str(error.value)
    assert store.running() is None


def test_a_server_that_never_answers_is_stopped(tmp_path: Path, stand_in: list[str]) -> None:
    # A process that listens nowhere, and says its pid in the log.
    code = "import os, time; print(os.getpid(), flush=True); time.sleep(60)"
    stand_in[:] = [sys.executable, "-c", code]
    store = ObjectStore(served(tmp_path, free_port()))
    message = f"did not answer.*{re.escape(str(store.log_file))}"
    with pytest.raises(ProcessError, match=message):
        store.start(timeout_s=1.0)
    assert not is_running(int(store.log_file.read_text().split()[0]))
    assert store.running() is None


@pytest.mark.integration
def test_a_real_server_stores_delta_tables_and_stops_by_its_pid(tmp_path: Path) -> None:
    from deltalake import DeltaTable, write_deltalake

    settings = served(tmp_path, free_port())
    store = ObjectStore(settings)
    try:
        assert store.start()
        pid = store.pid
        assert pid is not None
        # Started again: the running server is kept.
        assert not store.start() and store.pid == pid

        uri = "s3://tables/t"
        options = storage_options(settings.storage, uri)
        table = pa.table({"id": [1, 2, 3], "name": ["a", "b", "c"]})
        write_deltalake(uri, table, storage_options=options)
        assert DeltaTable(uri, storage_options=options).to_pyarrow_table() == table
        # The objects are files in the bucket's directory.
        assert list((store.bucket_dir / "t" / "_delta_log").glob("*.json"))
    finally:
        stopped = store.stop()
    assert stopped and not is_running(pid)
    assert store.running() is None and not store.process.pid_file.exists()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", store.port))  # the port is free again
