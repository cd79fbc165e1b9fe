"""Daemon threads for sync tools: a call past its time limit is let go and cannot hold the process.

`asyncio.to_thread` runs on the loop's default executor, whose threads the interpreter joins at
exit: one hung tool call would then keep a stopping worker alive for ever. These threads are
daemons, reused while calls keep coming (a tool's thread-local connection survives between
calls) and never waited for at exit.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

IDLE_S = 60.0
"""How long a thread with nothing to do waits for another call before it ends."""

Job = Callable[[], None]


class DaemonThreads:
    """A pool that grows by one thread whenever every thread is busy (a call never waits)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._jobs: queue.SimpleQueue[Job] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        """Threads waiting for a job, minus the jobs queued for them."""

    def submit(self, job: Job) -> None:
        """Run `job` on an idle thread, or on a new one. `job` must not raise."""
        with self._lock:
            reuse = self._idle > 0
            if reuse:
                self._idle -= 1
        if reuse:
            self._jobs.put(job)
        else:
            threading.Thread(target=self._work, args=(job,), name=self.name, daemon=True).start()

    def _work(self, job: Job) -> None:
        while True:
            job()
            with self._lock:
                self._idle += 1
            while True:
                try:
                    job = self._jobs.get(timeout=IDLE_S)
                    break
                except queue.Empty:
                    with self._lock:
                        if self._idle > 0:  # no job is queued for this thread: end it
                            self._idle -= 1
                            return
                    # a job was queued just as the wait ran out: take it


tool_threads = DaemonThreads("contextos-tool")
"""The threads every sync tool call (and sync reconcile) runs on."""
