"""Long-running jobs (training runs) that outlive a step: start, check, cancel.

Each job runs in its own process group with its output in `<run>/jobs/<id>.log`.
All jobs are killed at the end of the run; after a crash, jobs the checkpoint
knows of are killed on resume, so no training run is left behind unsupervised.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel


class JobRecord(BaseModel):
    id: str
    command: str
    pid: int
    log: str
    started_at: float
    exit_code: int | None = None


@dataclass
class JobManager:
    log_dir: Path
    jobs: dict[str, JobRecord] = field(default_factory=dict)
    _procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    _held: dict[str, int] = field(default_factory=dict)  # a job's sandbox status pipe, open until the job ends

    def hold(self, job_id: str, fd: int) -> None:
        self._held[job_id] = fd

    def _release(self, job_id: str) -> None:
        fd = self._held.pop(job_id, None)
        if fd is not None:
            os.close(fd)

    def start(
        self, command: str, argv: list[str], cwd: Path, env: dict[str, str], pass_fds: tuple[int, ...] = ()
    ) -> JobRecord:
        """Start `argv` (which runs `command`, in the run's sandbox where it has one) as a job; `pass_fds` stay open
        in it (the sandbox's status pipe)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        job_id = f"job{len(self.jobs) + 1}"
        log = self.log_dir / f"{job_id}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=pass_fds,
            )
        record = JobRecord(id=job_id, command=command, pid=proc.pid, log=str(log), started_at=time.time())
        self.jobs[job_id] = record
        self._procs[job_id] = proc
        return record

    def poll(self, job_id: str) -> JobRecord | None:
        record = self.jobs.get(job_id)
        proc = self._procs.get(job_id)
        if record is not None and proc is not None and record.exit_code is None:
            record.exit_code = proc.poll()
        if record is not None and record.exit_code is not None:
            self._release(job_id)
        return record

    def cancel(self, job_id: str) -> JobRecord | None:
        record = self.poll(job_id)
        if record is not None and record.exit_code is None:
            kill_group(record.pid)
            proc = self._procs.get(job_id)
            if proc is not None:
                proc.wait(timeout=10)
                record.exit_code = proc.returncode
        self._release(job_id)
        return record

    def kill_all(self) -> None:
        for job_id in list(self.jobs):
            self.cancel(job_id)
        for record in self.jobs.values():  # jobs restored from a checkpoint have no Popen
            if record.exit_code is None:
                kill_group(record.pid)
                record.exit_code = -9

    def restore(self, records: list[JobRecord]) -> None:
        """After a crash: the old jobs lost their supervisor; stop them and keep their logs."""
        for record in records:
            if record.exit_code is None:
                kill_group(record.pid)
                record.exit_code = -9
            self.jobs[record.id] = record


def kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def tail(path: Path, max_chars: int) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_chars))
            data = fh.read().decode(errors="replace")
    except FileNotFoundError:
        return ""
    return data if size <= max_chars else f"[... {size - max_chars:,} earlier bytes in {path.name} ...]\n{data}"
