"""A pretend GPU training service, controlled by the example (in memory, one process).

``script(customer, ...)`` decides what the customer's next jobs do: finish
after some polls, fail, or succeed while the download of the model crashes.
Submissions are idempotent by key, as a real provider's are.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

__all__ = ["Job", "PretendGPU", "gpu"]


@dataclass
class Job:
    id: str
    customer: str
    outcome: str  # "succeeded" or "failed" once finished
    polls_left: int
    crash_download: bool
    finished_at: float | None = None

    @property
    def status(self) -> str:
        return "running" if self.finished_at is None else self.outcome


@dataclass
class PretendGPU:
    retry_after: float = 0.1
    """The poll interval the service suggests while a job runs."""
    jobs: dict[str, Job] = field(default_factory=dict)
    submissions: list[str] = field(default_factory=list)
    models: dict[str, str] = field(default_factory=dict)
    _plans: dict[str, list[tuple[str, int, bool]]] = field(default_factory=dict)
    _by_key: dict[str, str] = field(default_factory=dict)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _new_data: dict[str, float] = field(default_factory=dict)

    def script(self, customer: str, *outcomes: str, polls: int = 2, crash_download: bool = False) -> None:
        """The customer's next jobs end in ``outcomes`` ("succeeded"/"failed") after ``polls`` polls."""
        self._plans[customer] = [(o, polls, crash_download) for o in outcomes]

    def customers(self) -> list[str]:
        """Every customer with training data (scripted jobs or past ones)."""
        return sorted(set(self._plans) | {j.customer for j in self.jobs.values()})

    async def check_readiness(self, customer: str) -> None:
        if customer not in self._plans and not any(j.customer == customer for j in self.jobs.values()):
            raise LookupError(f"no training data for {customer}")

    async def submit(self, customer: str, *, idempotency_key: str) -> str:
        if idempotency_key in self._by_key:  # a re-delivered visit: the same job
            return self._by_key[idempotency_key]
        plan = self._plans.get(customer) or [("succeeded", 2, False)]
        outcome, polls, crash = plan.pop(0) if len(plan) > 1 else plan[0]
        job = Job(f"job-{next(self._ids)}", customer, outcome, polls, crash)
        self.jobs[job.id] = job
        self._by_key[idempotency_key] = job.id
        self.submissions.append(customer)
        return job.id

    async def status(self, job_id: str) -> tuple[str, float]:
        """The job's status and the suggested wait before asking again."""
        job = self.jobs[job_id]
        if job.finished_at is None:
            job.polls_left -= 1
            if job.polls_left <= 0:
                job.finished_at = time.time()
        return job.status, self.retry_after

    async def last_job(self, customer: str) -> Job | None:
        mine = [j for j in self.jobs.values() if j.customer == customer and j.finished_at is not None]
        return max(mine, key=lambda j: j.finished_at or 0.0) if mine else None

    def new_data_since(self, customer: str, when: float) -> bool:
        return self._new_data.get(customer, 0.0) > when

    async def download(self, job_id: str) -> bytes:
        job = self.jobs[job_id]
        if job.crash_download:
            job.crash_download = False  # the next download works
            raise ConnectionResetError(f"download of {job_id} was cut off")
        return f"weights of {job.customer} from {job_id}".encode()


gpu = PretendGPU()
