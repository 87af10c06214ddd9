"""Progress while a job runs: a line per Spark stage, from Spark's status tracker.

    [stage 3] 4/9 tasks  (save at rebuild.py:399)
    [stage 3] done: 9 tasks in 4.2 s

A thread polls the tracker every `interval` seconds and prints a stage's line when it starts, when
its completed tasks change (at most every `every` seconds) and when it ends; on leaving, every
stage of the block's jobs that was not yet reported done is, so a job shorter than one poll
still gets its lines.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
import uuid


class StageProgress:
    def __init__(self, spark, out=None, interval: float = 0.5, every: float = 5.0) -> None:
        self.context = spark.sparkContext
        self.tracker = self.context.statusTracker()
        self.out = out or sys.stderr
        self.interval, self.every = interval, every
        self.group = f"tidemq-{uuid.uuid4().hex[:12]}"
        self.shown: dict[int, tuple[int, float]] = {}  # stage -> (completed tasks shown, when)
        self.started: dict[int, float] = {}
        self.done: set[int] = set()
        self.stopping = threading.Event()

    def _stages(self):
        for job_id in self.tracker.getJobIdsForGroup(self.group):
            job = self.tracker.getJobInfo(job_id)
            for stage_id in job.stageIds if job else ():
                info = self.tracker.getStageInfo(stage_id)
                if info is not None:
                    yield stage_id, info

    def _print(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def poll(self, final: bool = False) -> None:
        now = time.monotonic()
        active = set(self.tracker.getActiveStageIds())
        for stage_id, info in sorted(self._stages(), key=lambda item: item[0]):
            if stage_id in self.done:
                continue
            started = self.started.setdefault(stage_id, now)
            if info.numCompletedTasks >= info.numTasks and stage_id not in active:
                self.done.add(stage_id)
                self._print(f"[stage {stage_id}] done: {info.numTasks} tasks in {now - started:.1f} s")
                continue
            if final and info.numFailedTasks:
                self.done.add(stage_id)
                self._print(f"[stage {stage_id}] failed after {info.numCompletedTasks}/{info.numTasks} tasks")
                continue
            if stage_id not in active:
                continue  # skipped (its output was already there) or not begun
            shown, when = self.shown.get(stage_id, (-1, 0.0))
            if shown < 0 or (info.numCompletedTasks != shown and now - when >= self.every):
                self.shown[stage_id] = (info.numCompletedTasks, now)
                self._print(f"[stage {stage_id}] {info.numCompletedTasks}/{info.numTasks} tasks  ({info.name})")

    def _run(self) -> None:
        while not self.stopping.wait(self.interval):
            try:
                self.poll()
            except Exception:  # the context is stopping: the final poll says what it can
                return

    @contextlib.contextmanager
    def track(self):
        """Report the stages of the jobs started inside the block (on this thread)."""
        self.context.setJobGroup(self.group, "tidemq pipeline job")
        thread = threading.Thread(target=self._run, name="tidemq-progress", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.stopping.set()
            thread.join()
            with contextlib.suppress(Exception):
                self.poll(final=True)
            for key in ("spark.jobGroup.id", "spark.job.description"):
                self.context.setLocalProperty(key, None)
