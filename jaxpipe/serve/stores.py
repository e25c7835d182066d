"""The server's in-memory stores: served files (``response_format="url"``) and video jobs, each bounded."""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
import uuid
from typing import Any

from jaxpipe.engine import Engine, Handle
from jaxpipe.serve.errors import APIError

__all__ = ["STATUS", "FileStore", "Job", "JobStore", "job_json"]

_FILES_MAX = 256
_FILES_MAX_BYTES = 64 * 2**20
_JOBS_MAX = 1024
STATUS = {
    "queued": "queued",
    "running": "in_progress",
    "completed": "completed",
    "failed": "failed",
    "cancelled": "cancelled",
}


class FileStore:
    """Bounded in-memory files (``response_format="url"``): the oldest go first past ``max_files`` or ``max_bytes``."""

    def __init__(self, max_files: int = _FILES_MAX, max_bytes: int = _FILES_MAX_BYTES):
        self.max_files, self.max_bytes = max_files, max_bytes
        self._files: collections.OrderedDict[str, tuple[bytes, str]] = collections.OrderedDict()
        self._lock = threading.Lock()

    def put(self, data: bytes, media_type: str) -> str:
        """Store ``data``; returns its id."""
        file_id = f"file-{uuid.uuid4().hex}"
        with self._lock:
            self._files[file_id] = (data, media_type)
            while len(self._files) > self.max_files or (
                len(self._files) > 1 and sum(len(d) for d, _ in self._files.values()) > self.max_bytes
            ):
                self._files.popitem(last=False)
        return file_id

    def get(self, file_id: str) -> tuple[bytes, str]:
        """The file's bytes and media type; a 404 if it is unknown or expired."""
        with self._lock:
            found = self._files.get(file_id)
        if found is None:
            raise APIError(
                404,
                f"no file {file_id!r} (files are kept in memory, the latest {self.max_files}); "
                "ask again with response_format=b64_json to get the bytes in the answer",
                param="file_id",
                code="file_not_found",
            )
        return found


@dataclasses.dataclass(eq=False)
class Job:
    id: str
    handle: Handle
    model: str
    prompt: str
    size: str | None
    seconds: str
    created_at: int
    arrived: float
    progress: int = 0
    completed_at: int | None = None
    gif: bytes | None = None


class JobStore:
    """Video jobs by id; past ``max_jobs``, the oldest finished jobs are forgotten."""

    def __init__(self, max_jobs: int = _JOBS_MAX):
        self.max_jobs = max_jobs
        self._jobs: collections.OrderedDict[str, Job] = collections.OrderedDict()
        self._lock = threading.Lock()

    def add(self, job: Job) -> None:
        """Keep ``job``."""
        with self._lock:
            self._jobs[job.id] = job
            if len(self._jobs) > self.max_jobs:
                for old in [j for j in self._jobs.values() if j.handle.done()][: len(self._jobs) - self.max_jobs]:
                    del self._jobs[old.id]

    def get(self, job_id: str) -> Job:
        """The job ``job_id``; a 404 if unknown."""
        with self._lock:
            job = self._jobs.get(job_id)
        if job is None:
            raise APIError(
                404,
                f"no video job {job_id!r} (jobs are kept in memory, the latest {self.max_jobs})",
                param="video_id",
                code="video_not_found",
            )
        return job


def _fraction(engine: Engine, model_id: str, stage: str, loop: str | None, step: int, num_steps: int) -> float:
    """How far a request is through its model, in [0, 1], from its progress (stage path, loop, step)."""
    if model_id in engine.workflows():
        stages = engine.workflow(model_id).stages
        head, _, rest = stage.partition("/")
        labels = [s.label for s in stages]
        if head not in labels:
            return 0.0
        i = labels.index(head)
        return (i + _fraction(engine, stages[i].model, rest, loop, step, num_steps)) / len(labels)
    loops = [node.loop for node in engine.program(model_id).loops]
    if not loops:
        return 0.0
    j = loops.index(loop) if loop in loops else 0
    return (j + (step / num_steps if num_steps else 0.0)) / len(loops)


def job_json(engine: Engine, job: Job) -> dict[str, Any]:
    """OpenAI's video object for ``job``: id, status, progress (from the engine's step events), size, seconds, times.

    Args:
      engine: the engine running the job.
      job: the video job.

    Returns:
      The JSON-ready object.
    """
    h = job.handle
    status = STATUS[h.status]
    if status == "completed":
        job.progress = 100
        job.completed_at = job.completed_at or int(time.time())
    elif status in ("queued", "in_progress"):
        p = h.progress
        job.progress = max(
            job.progress, min(99, int(100 * _fraction(engine, job.model, p.stage, p.loop, p.step, p.num_steps)))
        )
    error = None
    if status == "failed":
        err = h.exception(0)
        error = {"code": "generation_failed", "message": f"{type(err).__name__}: {err}"}
    elif status == "cancelled":
        error = {"code": "cancelled", "message": "the job was cancelled"}
    return {
        "id": job.id,
        "object": "video",
        "model": job.model,
        "status": status,
        "progress": job.progress,
        "created_at": job.created_at,
        "completed_at": job.completed_at,
        "expires_at": None,
        "prompt": job.prompt,
        "size": job.size,
        "seconds": job.seconds,
        "remixed_from_video_id": None,
        "error": error,
    }
