"""Processes of the local stack, tracked by pid files and stopped by their own pid.

A pid file holds the pid *and* the process's start time (from /proc), so a pid reused by an
unrelated process after a crash is recognised as stale instead of being signalled.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


class ProcessError(Exception):
    """A stack process could not be started or stopped; the message names its log file."""


def proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (field 3 on: state, parent pid,
    ..., utime at [11], stime at [12], start time at [19]); None if there is no such process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) may hold spaces; everything after its closing ')' is fixed.
    return raw[raw.rindex(")") + 2 :].split()


def start_ticks(pid: int) -> int | None:
    """When the process started (clock ticks since boot), or None if it does not exist."""
    fields = proc_stat(pid)
    return int(fields[19]) if fields else None


def is_running(pid: int, ticks: int | None = None) -> bool:
    """True if `pid` is alive (not a zombie) and, when given, started at `ticks`."""
    fields = proc_stat(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return False
    return ticks is None or int(fields[19]) == ticks


@dataclass(frozen=True)
class ProcessRecord:
    pid: int
    ticks: int
    argv: list[str]


class ManagedProcess:
    """One named process of the stack: its pid file, its log file, start and stop."""

    def __init__(self, name: str, run_dir: Path, log_file: Path) -> None:
        self.name = name
        self.pid_file = run_dir / f"{name}.pid"
        self.log_file = log_file
        self._child: subprocess.Popen[bytes] | None = None

    def record(self) -> ProcessRecord | None:
        """The live process this pid file names, or None; a stale pid file is removed."""
        try:
            saved = json.loads(self.pid_file.read_text())
        except FileNotFoundError:
            return None
        except (ValueError, OSError) as error:
            raise ProcessError(f"{self.pid_file} is unreadable ({error}); remove it") from error
        record = ProcessRecord(int(saved["pid"]), int(saved["ticks"]), list(saved["argv"]))
        if is_running(record.pid, record.ticks):
            return record
        self.pid_file.unlink(missing_ok=True)
        return None

    def start(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> ProcessRecord:
        if (running := self.record()) is not None:
            raise ProcessError(f"{self.name} is already running (pid {running.pid})")
        self._reap_previous()
        self.pid_file.parent.mkdir(parents=True, exist_ok=True)
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as log:
            # A session of its own: Ctrl-C in the terminal reaches `dispatch up`, which then
            # stops its children in order, instead of every process dying at once.
            self._child = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                start_new_session=True,
            )
        ticks = start_ticks(self._child.pid)
        if ticks is None:
            raise ProcessError(f"{self.name} exited at once; see {self.log_file}")
        record = ProcessRecord(self._child.pid, ticks, list(argv))
        self.pid_file.write_text(json.dumps(record.__dict__))
        return record

    def exit_code(self) -> int | None:
        """The exit code if this object started the process and it has ended, else None."""
        return self._child.poll() if self._child is not None else None

    def stop(self, timeout_s: float = 30.0) -> bool:
        """SIGTERM, then SIGKILL after `timeout_s`. Returns True if a process was stopped."""
        record = self.record()
        if record is None:
            self._reap()
            return False
        os.kill(record.pid, signal.SIGTERM)
        if not self._wait_gone(record, timeout_s):
            # The whole process group (its own session, see start): a Spark driver's JVM
            # child must not outlive it.
            os.killpg(record.pid, signal.SIGKILL)
            if not self._wait_gone(record, 10.0):
                raise ProcessError(f"{self.name} (pid {record.pid}) survived SIGKILL")
        self.pid_file.unlink(missing_ok=True)
        return True

    def _wait_gone(self, record: ProcessRecord, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._reap()
            if not is_running(record.pid, record.ticks):
                # A zombie child is not running but not reaped yet either: wait for it, or
                # Python warns that the subprocess is still running.
                if self._child is not None and self._child.pid == record.pid:
                    self._child.wait(timeout=5)
                return True
            time.sleep(0.1)
        return False

    def _reap(self) -> None:
        # A child we started stays a zombie until waited for.
        if self._child is not None:
            self._child.poll()

    def _reap_previous(self, timeout_s: float = 10.0) -> None:
        """Wait for the child this object started before, which no longer runs (a kill -9 can
        leave /proc unreadable while the process is still exiting, before it is a zombie):
        replaced unreaped, Python would warn at collection that it is "still running"."""
        previous = self._child
        if previous is None or previous.poll() is not None:
            return
        try:
            previous.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired as error:
            raise ProcessError(
                f"{self.name}: the previous process (pid {previous.pid}) has not exited"
            ) from error

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log yet)"
