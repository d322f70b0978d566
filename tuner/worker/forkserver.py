"""A pre-imported server that forks trial children, so a CPU trial's child starts in milliseconds.

A fresh interpreter per trial spends about a second of a core importing NumPy, ONNX Runtime and the
tuner before it does any work. For routes whose backend allows it (`Backend.fork_safe`: nothing the
server imports initialises a device runtime such as CUDA, which cannot be used in a forked child),
a process that runs trials starts one server, `python -m tuner.worker.child --serve FD MODULE...`,
that has imported `tuner.worker.child` and the backend's modules (`Backend.preload`), and asks it for
each trial's child over a Unix socket. What a fresh child had, a forked one has too:

- its own session and process group (`setsid`, before its pid is reported), so a timeout or a stop
  kills the whole group, also one that arrives while the child is being started;
- `PR_SET_PDEATHSIG`: the server dies with the process that started it and each child with the
  server, so a SIGKILLed worker leaves no child behind; the child's own deadline (SIGALRM) is set
  by `tuner.worker.child.main` as before;
- the environment its starter gives it (`tuner.worker.isolate.child_env`: no credentials), with
  the starter's pid in `TUNER_STARTER_PID` (its parent is the server);
  variables read only at import time are the server's, started with the starter's environment;
- the startup hold of the host lock (`tuner.measure.exclusive`): the starter passes the held
  descriptor over the socket (SCM_RIGHTS) and the child inherits that open file description, as
  it would through `Popen(pass_fds=...)`;
- its log on stdout and stderr, stdin from /dev/null, and no other descriptor of the server;
- its exit status as `Popen.returncode` gives it (negative: the signal), sent back by the server,
  which reaps it; a server that vanished reads as the child killed by SIGKILL.
The child's process title is the command line a fresh child would have (`setproctitle`), so `ps`
and whatever looks for trial children by command line still finds them.

Protocol (SOCK_SEQPACKET, one JSON message each): the server says `ready` once its imports are
done; a request carries argv, env, cwd and title with the descriptors [reply socket, log, hold?];
on the reply socket the server sends `{"pid": n}` after the fork and `{"rc": n}` once it reaped
the child. The server exits when its control socket closes. `TUNER_FORK_SERVER=0` turns it off.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import selectors
import shlex
import signal
import socket
import subprocess
import sys
import threading
import traceback
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn, Protocol

from tuner.measure.exclusive import STARTUP_HOLD_ENV
from tuner.worker.lifeline import PARENT_ENV, STARTER_ENV, die_with_parent

log = logging.getLogger("tuner.worker")
ENABLE_ENV = "TUNER_FORK_SERVER"  # "0": every trial child is a fresh interpreter
# Set in the starter by a library it imports, and for a library the server does not load: a change in them alone
# keeps the server (scikit-learn, imported by the local search's first fit, sets KMP_INIT_AT_FORK for Intel OpenMP)
STARTER_LIBRARY_ENV = frozenset({"KMP_INIT_AT_FORK"})
CHILD_MODULE = "tuner.worker.child"
READY = b"ready"
MESSAGE_MAX = 1 << 20
START_TIMEOUT_S = 120.0  # a server not ready by then is given up for this child (a fresh interpreter runs it)


class Child(Protocol):
    """What `run_isolated` uses of a started child: `subprocess.Popen`'s pid, returncode and wait."""

    pid: int
    returncode: int | None

    def wait(self, timeout: float | None = None) -> int: ...


def command(argv: Sequence[str]) -> list[str]:
    """The command line of a fresh trial child with arguments `argv`."""
    return [sys.executable, "-m", CHILD_MODULE, *argv]


class ForkedChild:
    """A child forked by the server; `wait` reads its exit status from the reply socket."""

    def __init__(self, pid: int, reply: socket.socket, title: str) -> None:
        self.pid, self.reply, self.title = pid, reply, title
        self.returncode: int | None = None

    def wait(self, timeout: float | None = None) -> int:
        """The exit status, as `Popen.wait` (raises `subprocess.TimeoutExpired` after `timeout` seconds)."""
        if self.returncode is not None:
            return self.returncode
        self.reply.settimeout(timeout)
        try:
            message = self.reply.recv(MESSAGE_MAX)
        except TimeoutError:
            raise subprocess.TimeoutExpired(self.title, timeout or 0.0) from None
        except OSError:
            message = b""
        self.returncode = int(json.loads(message)["rc"]) if message else -signal.SIGKILL  # no server: it died with it
        self.reply.close()
        return self.returncode


class ServerGone(Exception):
    """The server did not start, or stopped answering."""


class ForkServer:
    """The starter's end of one server: started with `env`, having imported `preload`."""

    def __init__(self, preload: Sequence[str], env: Mapping[str, str]) -> None:
        self.preload, self.env = tuple(preload), dict(env)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                command(["--serve", str(theirs.fileno()), *self.preload]),
                pass_fds=(theirs.fileno(),),
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            theirs.close()
        self.control = ours
        ours.settimeout(START_TIMEOUT_S)
        try:
            ready = ours.recv(MESSAGE_MAX)
        except OSError as exc:
            ready = str(exc).encode()
        if ready != READY:
            self.close()
            raise ServerGone(f"the child server did not start ({ready.decode(errors='replace') or 'it exited'})")
        ours.settimeout(None)

    def alive(self) -> bool:
        """The server process is still running."""
        return self.proc.poll() is None

    def spawn(self, argv: Sequence[str], env: Mapping[str, str], log_fd: int, keep_fd: int | None) -> ForkedChild:
        """Fork a child running `tuner.worker.child.main(argv)` with `env`, its output to `log_fd`, inheriting
        `keep_fd`."""
        title = shlex.join(command(argv))
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        request = {"argv": list(argv), "env": dict(env), "cwd": os.getcwd(), "title": title}
        fds = [theirs.fileno(), log_fd] + ([keep_fd] if keep_fd is not None else [])
        try:
            socket.send_fds(self.control, [json.dumps(request).encode()], fds)
            theirs.close()
            message = ours.recv(MESSAGE_MAX)
        except OSError as exc:
            ours.close()
            raise ServerGone(f"the child server stopped answering: {exc}") from exc
        finally:
            theirs.close()
        if not message:
            ours.close()
            raise ServerGone("the child server exited")
        return ForkedChild(int(json.loads(message)["pid"]), ours, title)

    def close(self) -> None:
        """Close the control socket (the server exits)."""
        self.control.close()


_SERVERS: dict[tuple[str, ...], ForkServer] = {}
_SERVERS_LOCK = threading.Lock()


def enabled() -> bool:
    """Whether trial children may be forked from a server here ($TUNER_FORK_SERVER is not 0)."""
    return os.environ.get(ENABLE_ENV, "1") != "0"


def server_for(preload: Sequence[str], env: Mapping[str, str]) -> ForkServer:
    """This process's server for `preload`, started now with `env` if there is none alive with that environment."""
    key = tuple(preload)
    with _SERVERS_LOCK:
        server = _SERVERS.get(key)
        if server is not None and server.alive() and _same(server.env, env):
            return server
        if server is not None:
            server.close()  # one server per module set: a changed environment replaces it
            del _SERVERS[key]
        _SERVERS[key] = server = ForkServer(preload, env)
        return server


def _same(started_with: Mapping[str, str], env: Mapping[str, str]) -> bool:
    """Whether a server started with `started_with` serves a starter whose environment is now `env`."""
    return {k: v for k, v in started_with.items() if k not in STARTER_LIBRARY_ENV} == {
        k: v for k, v in env.items() if k not in STARTER_LIBRARY_ENV
    }


def start_child(
    argv: Sequence[str],
    env: Mapping[str, str],
    log_fd: int,
    keep_fd: int | None,
    preload: Sequence[str] | None,
    server_env: Mapping[str, str],
) -> Child:
    """Start a trial child: forked from the pre-imported server when `preload` is given, else a fresh interpreter.

    `env` is the child's environment (with `STARTUP_HOLD_ENV` naming `keep_fd` where one is handed down),
    `server_env` the environment a server is started with. A server that cannot be used is reported
    once and the child runs as a fresh interpreter.
    """
    if preload is not None and enabled():
        try:
            server = server_for(preload, server_env)
            return server.spawn(argv, env, log_fd, keep_fd)
        except ServerGone as exc:
            log.warning("%s; this trial's child is a fresh interpreter", exc)
            with _SERVERS_LOCK:
                _SERVERS.pop(tuple(preload), None)
    return subprocess.Popen(
        command(argv),
        stdout=log_fd,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        pass_fds=(keep_fd,) if keep_fd is not None else (),
        env=dict(env),
    )


# -- the server's side ------------------------------------------------------------------------------


def serve(control_fd: int, preload: Sequence[str]) -> int:
    """The server's loop: import `preload`, then fork a child per request and report how each ended."""
    die_with_parent(signal.SIGKILL)
    for name in (CHILD_MODULE, "setproctitle", *preload):
        importlib.import_module(name)
    control = socket.socket(fileno=control_fd)
    control.send(READY)
    selector = selectors.DefaultSelector()
    selector.register(control, selectors.EVENT_READ)
    children: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, reply socket)
    while True:
        for key, _ in selector.select():
            if key.fileobj is control:
                message, fds, _, _ = socket.recv_fds(control, MESSAGE_MAX, 3)
                if not message:
                    _end(children)
                    return 0
                pidfd, pid, reply = _fork(json.loads(message), fds)
                children[pidfd] = (pid, reply)
                selector.register(pidfd, selectors.EVENT_READ)
            else:
                pidfd = int(key.fd)
                selector.unregister(pidfd)
                pid, reply = children.pop(pidfd)
                _report(reply, {"rc": os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])})
                os.close(pidfd)


def _fork(request: dict[str, Any], fds: list[int]) -> tuple[int, int, socket.socket]:
    """Fork the requested child; (its pidfd, its pid, the reply socket) once it is told the pid."""
    reply, log_fd, keep_fd = socket.socket(fileno=fds[0]), fds[1], (fds[2] if len(fds) > 2 else None)
    sys.stdout.flush()
    sys.stderr.flush()
    started, announce = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(started)
        _become_child(request, log_fd, keep_fd, announce)
    os.close(announce)
    os.read(started, 1)  # the child leads its own process group now (or died): a kill of the group reaches it
    os.close(started)
    os.close(log_fd)
    if keep_fd is not None:
        os.close(keep_fd)  # the child holds it now
    pidfd = os.pidfd_open(pid)
    _report(reply, {"pid": pid})
    return pidfd, pid, reply


def _report(reply: socket.socket, message: dict[str, int]) -> None:
    try:
        reply.send(json.dumps(message).encode())
    except OSError:
        pass  # the starter is gone: nobody to tell
    if "rc" in message:
        reply.close()


def _end(children: dict[int, tuple[int, socket.socket]]) -> None:
    """The starter closed the control socket: its children have nobody left to report to."""
    for pid, _ in children.values():
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)


def _become_child(request: dict[str, Any], log_fd: int, keep_fd: int | None, announce: int) -> NoReturn:
    """In the forked child: become what `python -m tuner.worker.child ARGV` would be, run it, exit.

    `announce` is closed once the child leads its own session, before the server tells the starter its pid.
    """
    rc = 1
    try:
        server = os.getppid()
        os.setsid()
        os.close(announce)
        import setproctitle

        setproctitle.setproctitle(request["title"])
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        keep = keep_fd if keep_fd is not None else 2
        os.closerange(3, keep)  # nothing of the server's: its sockets, other children's descriptors
        os.closerange(keep + 1, os.sysconf("SC_OPEN_MAX"))
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update({**request["env"], PARENT_ENV: str(server), STARTER_ENV: request["env"].get(PARENT_ENV, "")})
        os.environ.pop(STARTUP_HOLD_ENV, None)
        if keep_fd is not None:
            os.environ[STARTUP_HOLD_ENV] = str(keep_fd)
        _reseed()
        rc = importlib.import_module(CHILD_MODULE).main(
            list(request["argv"])
        )  # by name: the child module starts this server
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, int | None):
            print(exc.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(rc)


def _reseed() -> None:
    """A fresh process draws fresh random numbers: reseed NumPy's global generator (`random` reseeds itself at fork)."""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
