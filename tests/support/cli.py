"""One-shot ``python -m eventbus`` commands, each a process of its own, without an interpreter start each.

Starting Python and importing eventbus took most of a short command's time,
and the tests run hundreds of them. A test process therefore starts one helper
(``python -m tests.support.cli``) that has imported eventbus and its drivers
and waits; :func:`run_cli` asks it to fork, and the child runs the command as
``python -m eventbus`` does (``runpy``, the given argv, environment and working
directory, stdin from ``/dev/null``, stdout and stderr to files), then exits
with the command's code. Each command is still a separate process with its own
pid, exit code, output and environment, ended by SIGKILL after its timeout, as
``subprocess.run`` would. The helper imports no application module (an app
reads ``EVENTBUS_DSN`` when imported), so every child imports its app itself.

Commands that must start a fresh interpreter (the installed ``eventbus``
script, long-running workers that get signals) keep using ``subprocess``.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

__all__ = ["run_cli"]


class _Helper:
    """The forking helper of this test process, started on first use and ended at exit."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.popen: subprocess.Popen[bytes] | None = None

    def _started(self) -> subprocess.Popen[bytes]:
        if self.popen is None or self.popen.poll() is not None:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "tests.support.cli"],
                cwd=ROOT,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
            atexit.register(self.close)
        return self.popen

    def close(self) -> None:
        popen, self.popen = self.popen, None
        if popen is not None and popen.poll() is None:
            assert popen.stdin is not None
            popen.stdin.close()  # the helper ends when its requests end
            try:
                popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait(timeout=10)

    def run(self, request: dict[str, Any], timeout: float) -> int:
        """Send one command; its exit code (negative: the signal that ended it)."""
        with self.lock:
            popen = self._started()
            assert popen.stdin is not None and popen.stdout is not None
            popen.stdin.write(json.dumps(request).encode() + b"\n")
            popen.stdin.flush()
            pid = int(json.loads(popen.stdout.readline())["pid"])
            killed = threading.Event()
            timer = threading.Timer(timeout, _kill, (pid, killed))
            timer.start()
            try:
                line = popen.stdout.readline()
            finally:
                timer.cancel()
            if not line:
                raise RuntimeError("the command helper exited")
            if killed.is_set():
                raise subprocess.TimeoutExpired(request["argv"], timeout)
            return int(json.loads(line)["rc"])


def _kill(pid: int, killed: threading.Event) -> None:
    """The command ran past its timeout: SIGKILL it, as ``subprocess.run`` does."""
    killed.set()
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


_HELPER = _Helper()


def run_cli(
    args: list[str] | tuple[str, ...],
    env: dict[str, str] | None = None,
    *,
    cwd: Path | str | None = None,
    timeout: float = 60,
    check: bool = False,
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run([python, "-m", "eventbus", *args], capture_output=True, text=True, ...)``, forked."""
    with tempfile.TemporaryDirectory(prefix="eventbus-cli-") as folder:
        out, err = Path(folder) / "stdout", Path(folder) / "stderr"
        request = {
            "argv": [str(a) for a in args],
            "env": dict(os.environ if env is None else env),
            "cwd": str(cwd if cwd is not None else os.getcwd()),
            "stdout": str(out),
            "stderr": str(err),
        }
        rc = _HELPER.run(request, timeout)
        result = subprocess.CompletedProcess(
            [sys.executable, "-m", "eventbus", *request["argv"]], rc, out.read_text(), err.read_text()
        )
    if check:
        result.check_returncode()
    return result


# -- the helper process --------------------------------------------------------


def _child(request: dict[str, Any]) -> None:
    """In the forked child: become ``python -m eventbus <argv>`` and exit with its code."""
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    sys.stdin = open(0, closefd=False)  # the process's stdin until it exits
    os.dup2(os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), 1)
    os.dup2(os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), 2)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.path[0] = request["cwd"]  # what ``-m`` puts first
    code = 0
    try:
        sys.argv = ["eventbus", *request["argv"]]
        runpy.run_module("eventbus", run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        code = _exit_code(stop.code)
    except BaseException:  # what the interpreter does with an uncaught exception
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        _finish(code)


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _finish(code: int) -> None:
    """Exit as the interpreter would: exit hooks run, logging and the streams flushed."""
    import logging

    try:
        atexit._run_exitfuncs()
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _serve() -> None:
    """Fork one child per request line on stdin; answer its pid, then its exit code, on stdout."""
    import asyncpg  # noqa: F401  (imported once here, not in each command)

    import eventbus.cli  # noqa: F401

    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            replies.close()
            _child(request)
        replies.write(json.dumps({"pid": pid}) + "\n")
        _, status = os.waitpid(pid, 0)
        replies.write(json.dumps({"rc": os.waitstatus_to_exitcode(status)}) + "\n")


if __name__ == "__main__":
    _serve()
