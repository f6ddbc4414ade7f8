"""Per-customer model retraining as a durable state machine.

The shape of the article: submit a GPU job, poll it for up to five hours
without holding a worker (each poll is one short visit), retry a failed job
through a capped pair of states, and resume a run whose job succeeded but
whose download crashed without paying for another training.

The application starts one run per customer every night from a single
fan-out schedule (``handlers.app``): :func:`active_customers` lists them,
:func:`checkpoint` builds each run's checkpoint, and ``spread=`` gives each
customer a fixed start time of its own in the window.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from eventbus.workflows import Goto, Machine, StepContext, Yield
from schemas import Retrain

from .gpu import gpu

machine = Machine("retrain", checkpoint=Retrain, key=lambda c: c.customer, max_checkpoint_bytes=4096)


@machine.state(initial=True, on_success="CHECK_LAST_TRAIN", on_failure="DONE")
async def INITIAL(c: Retrain, ctx: StepContext) -> None:
    await gpu.check_readiness(c.customer)  # any exception takes on_failure, the error is in the history


@machine.state(on_success="DOWNLOAD_SAVE", on_failure="SUBMIT_JOB")
async def CHECK_LAST_TRAIN(c: Retrain, ctx: StepContext) -> Goto | None:
    """Resume without retraining: a finished job and no newer data go straight to the download."""
    last = await gpu.last_job(c.customer)
    if last is None or last.status != "succeeded" or gpu.new_data_since(c.customer, last.finished_at or 0.0):
        return Goto("SUBMIT_JOB")  # a branch, not an error: Fail would record one
    c.job_id, c.resumed = last.id, True
    return None


@machine.state(on_success="POLL_JOB", on_failure="JOB_FAILED", max_visits=3)
async def SUBMIT_JOB(c: Retrain, ctx: StepContext) -> None:
    c.job_id = await gpu.submit(c.customer, idempotency_key=ctx.op_key)


@machine.state(
    on_success="DOWNLOAD_SAVE",
    on_failure="POLL_JOB",
    also=("JOB_FAILED",),
    continue_run=False,
    poll=timedelta(minutes=3),
    max_visits=100,
    max_age=timedelta(hours=5),
    wake_on="gpu.job_finished",
)
async def POLL_JOB(c: Retrain, ctx: StepContext) -> Yield | Goto | None:
    ctx.signal("gpu.job_finished")  # a webhook only wakes us early; the status call decides
    assert c.job_id is not None
    status, retry_after = await gpu.status(c.job_id)
    if status == "running":
        return Yield(poll=retry_after)  # commit and free the worker; back after the poll
    if status == "failed":
        return Goto("JOB_FAILED")
    return None  # a raised error (status API down) takes on_failure: poll again, capped


@machine.state(on_success="SUBMIT_JOB", on_failure="DONE", max_visits=3)
async def JOB_FAILED(c: Retrain, ctx: StepContext) -> None:
    c.job_id = None  # the retry partner of SUBMIT_JOB


@machine.state(on_success="DONE", on_failure="DONE")
async def DOWNLOAD_SAVE(c: Retrain, ctx: StepContext) -> None:
    assert c.job_id is not None
    weights = await gpu.download(c.job_id)
    gpu.models[c.customer] = weights.decode()
    c.model = f"model of {c.customer} ({len(weights)} bytes)"


machine.terminal("DONE")


async def active_customers() -> list[str]:
    """The customers whose models are kept fresh (in production: a query of the customer table)."""
    return gpu.customers()


def checkpoint(customer: str, scheduled_for: datetime) -> Retrain:
    """A nightly run's checkpoint; a run of the customer still live (polling a long job) is left alone."""
    return Retrain(customer=customer)
