"""A pre-imported server that forks trial children, workers and reference runs, so each starts in milliseconds.

A fresh interpreter spends about a second of a core importing NumPy, ONNX Runtime, Optuna,
scikit-learn and the tuner before it does any work. For routes whose backend allows it
(`Backend.fork_safe`: nothing the server imports initialises a device runtime such as CUDA, which
cannot be used in a forked child), a process that runs trials starts one server,
`python -m tuner.worker.child --serve FD MODULE...`, that has imported `tuner.worker.child` and the
backend's modules (`Backend.preload`), and asks it for each trial's child over a Unix socket. A
`tuner run` with CPU workers starts one such server for the whole study (`study_server`): it forks
the workers themselves (`tuner.worker.main`) and the fp32 reference run (`tuner.measure.reference`)
too, and each worker it forks gets a connection of its own to it, over which the worker asks for its
trials' children: one server for the study instead of one per worker, and no worker importing what
the server has. What a fresh process had, a forked one has too:

- its own session and process group (`setsid`, before its pid is reported), so a timeout or a stop
  kills the whole group, also one that arrives while the child is being started;
- `PR_SET_PDEATHSIG`: the server dies with the process that started it and each child with the
  server, so a SIGKILLed starter leaves no child behind; a process whose connection to the server
  closes (a SIGKILLed worker) has its children killed by the server; the child's own deadline
  (SIGALRM) is set by `tuner.worker.child.main` as before;
- the environment its starter gives it (`tuner.worker.isolate.child_env`: no credentials), with
  the starter's pid in `TUNER_STARTER_PID` (its parent is the server);
  variables read only at import time are the server's, started with the starter's environment;
- one descriptor handed down over the socket (SCM_RIGHTS), named by an environment variable: the
  startup hold of the host lock for a trial child (`tuner.measure.exclusive`), the pipe holding the
  storage URL for a worker; the child inherits that open file description, as it would through
  `Popen(pass_fds=...)`;
- its stdout and stderr as given, stdin from /dev/null, and no other descriptor of the server;
- its exit status as `Popen.returncode` gives it (negative: the signal), sent back by the server,
  which reaps it; a server that vanished reads as the child killed by SIGKILL.
The child's process title is the command line a fresh process would have (`setproctitle`), so `ps`
and whatever looks for trial children or workers by command line still finds them.

Protocol (SOCK_SEQPACKET, one JSON message each): the server says `ready` once its imports are
done; a request carries the module to run, argv, env, cwd, title, the modules to import first and
whether the child gets a connection of its own, with the descriptors [reply socket, stdout, stderr,
handed-down?]; on the reply socket the server sends `{"pid": n}` after the fork and `{"rc": n}` once
it reaped the child. The server exits when its control socket closes. `TUNER_FORK_SERVER=0` turns
it off: every such process is a fresh interpreter.
"""

from __future__ import annotations

import atexit
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
ENABLE_ENV = "TUNER_FORK_SERVER"  # "0": every trial child, worker and reference run is a fresh interpreter
# Set in the starter by a library it runs, for itself or for a library the server does not load: a change in them alone
# keeps the server (scikit-learn, imported by the local search's first fit, sets KMP_INIT_AT_FORK for Intel OpenMP;
# pytest names the test it is running in PYTEST_CURRENT_TEST, in a process that runs studies through the Python API;
# PyTorch's Inductor, compiling in the starter, sets its cache folder, which it reads again at every compile, and the
# address of an object of that process)
STARTER_LIBRARY_ENV = frozenset(
    {"KMP_INIT_AT_FORK", "PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR", "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR"}
)
CHILD_MODULE = "tuner.worker.child"
WORKER_MODULE = "tuner.worker.main"
REFERENCE_MODULE = "tuner.measure.reference"
ENTRIES = frozenset({CHILD_MODULE, WORKER_MODULE, REFERENCE_MODULE})  # a forked process runs `MODULE.main(argv)`
READY = b"ready"
MESSAGE_MAX = 1 << 20
START_TIMEOUT_S = 120.0  # a server not ready by then is given up for this child (a fresh interpreter runs it)
CLOSE_TIMEOUT_S = 10.0  # at exit, a server still running this long after its control socket closed is killed


class Child(Protocol):
    """What `run_isolated` uses of a started child: `subprocess.Popen`'s pid, returncode and wait."""

    pid: int
    returncode: int | None

    def wait(self, timeout: float | None = None) -> int: ...


def command(argv: Sequence[str], module: str = CHILD_MODULE) -> list[str]:
    """The command line of a fresh process running `module` with arguments `argv`."""
    return [sys.executable, "-m", module, *argv]


class ForkedChild:
    """A process forked by the server; `wait` reads its exit status from the reply socket."""

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
        except (TimeoutError, BlockingIOError):  # BlockingIOError: no wait at all (timeout 0)
            raise subprocess.TimeoutExpired(self.title, timeout or 0.0) from None
        except OSError:
            message = b""
        self.returncode = int(json.loads(message)["rc"]) if message else -signal.SIGKILL  # no server: it died with it
        self.reply.close()
        return self.returncode

    def poll(self) -> int | None:
        """The exit status if the process has ended, else None (as `Popen.poll`)."""
        try:
            return self.wait(timeout=0)
        except subprocess.TimeoutExpired:
            return None

    def send_signal(self, sig: int) -> None:
        """Send `sig` to the process unless it has been seen to end (as `Popen.send_signal`)."""
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass


class ServerGone(Exception):
    """The server did not start, or stopped answering."""


class Connection:
    """One end of a connection to a server: asks it for forked processes."""

    def __init__(self, control: socket.socket) -> None:
        self.control = control

    def alive(self) -> bool:
        """Whether the server may still answer."""
        return self.control.fileno() >= 0

    def spawn(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        log_fd: int,
        keep_fd: int | None,
        *,
        module: str = CHILD_MODULE,
        err_fd: int | None = None,
        keep_env: str = STARTUP_HOLD_ENV,
        preload: Sequence[str] = (),
        client: bool = False,
    ) -> ForkedChild:
        """Fork a process running `module.main(argv)` with `env`, its stdout to `log_fd` and stderr to `err_fd` (else
        `log_fd`), inheriting `keep_fd` (its number in `env[keep_env]`); the server imports `preload` first; with
        `client`, the process gets a connection of its own to the server, for its own children."""
        title = shlex.join(command(argv, module))
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        request = {
            "module": module,
            "argv": list(argv),
            "env": dict(env),
            "cwd": os.getcwd(),
            "title": title,
            "keep_env": keep_env,
            "preload": list(preload),
            "client": client,
        }
        fds = [theirs.fileno(), log_fd, log_fd if err_fd is None else err_fd] + (
            [keep_fd] if keep_fd is not None else []
        )
        try:
            self.ready()
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

    def ready(self) -> None:
        """Return once the server can fork (a connection handed down is ready at once)."""

    def close(self) -> None:
        """Close the connection (a server whose control socket it is exits)."""
        self.control.close()


class ForkServer(Connection):
    """The starter's end of one server: started with `env`, importing `preload` (it is ready once `ready` returns)."""

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
        super().__init__(ours)
        self._started = threading.Lock()
        self._ready = False

    def ready(self) -> None:
        """Wait (once) until the server has done its imports; ServerGone if it does not start."""
        with self._started:
            if self._ready:
                return
            self.control.settimeout(START_TIMEOUT_S)
            try:
                ready = self.control.recv(MESSAGE_MAX)
            except OSError as exc:
                ready = str(exc).encode()
            if ready != READY:
                self.close()
                raise ServerGone(f"the child server did not start ({ready.decode(errors='replace') or 'it exited'})")
            self.control.settimeout(None)
            self._ready = True

    def alive(self) -> bool:
        """The server process is still running."""
        return self.proc.poll() is None

    def is_ready(self) -> bool:
        """Whether the server was seen ready (`ready` returned)."""
        return self._ready


_SERVERS: dict[tuple[str, ...], ForkServer] = {}
_SERVERS_LOCK = threading.Lock()
_INHERITED: list[Connection] = []  # in a process the server forked with a connection of its own: that connection


def enabled() -> bool:
    """Whether processes may be forked from a server here ($TUNER_FORK_SERVER is not 0)."""
    return os.environ.get(ENABLE_ENV, "1") != "0"


def server_for(preload: Sequence[str], env: Mapping[str, str]) -> Connection:
    """The server this process forks from: the one that forked it, if it handed down a connection; else a server of
    this process alive with `env` that has imported at least `preload` (a study's server also serves the trial
    children of a confirmation or a reuse check); else one for `preload`, started now with `env`."""
    if _INHERITED and _INHERITED[0].alive():
        return _INHERITED[0]
    key = tuple(preload)
    with _SERVERS_LOCK:
        covering = (s for s in reversed(_SERVERS.values()) if set(key) <= set(s.preload))
        alive = next((s for s in covering if s.alive() and _same(s.env, env)), None)
        if alive is not None:
            return alive
        server = _SERVERS.get(key)
        if server is not None:
            server.close()  # one server per module set: a changed environment replaces it
            del _SERVERS[key]
            _reap(server)
        _SERVERS[key] = server = ForkServer(preload, env)
        return server


def started() -> Connection | None:
    """A server this process already forks from (handed down, or the latest started and alive), if any."""
    if _INHERITED and _INHERITED[0].alive():
        return _INHERITED[0]
    with _SERVERS_LOCK:
        return next((s for s in reversed(_SERVERS.values()) if s.alive()), None)


def forget(server: Connection) -> None:
    """Stop using `server` (it did not answer): later processes start another or run as fresh interpreters."""
    with _SERVERS_LOCK:
        for key in [k for k, s in _SERVERS.items() if s is server]:
            del _SERVERS[key]
    if server in _INHERITED:
        _INHERITED.clear()
    server.close()


@atexit.register
def _close_servers() -> None:
    """At this process's exit: close its servers and wait for them, so that they (and what they forked) end before it
    does and their CPU time is counted as its children's."""
    with _SERVERS_LOCK:
        servers = list(_SERVERS.values())
        _SERVERS.clear()
    for server in servers:
        server.close()
        _reap(server)


def _reap(server: ForkServer) -> None:
    """Wait for a closed server to exit (killing it after CLOSE_TIMEOUT_S, or at once if it never became ready: its
    imports would only hold up the exit of a command that stopped early, on bad input)."""
    if not server.is_ready():
        server.proc.kill()
    try:
        server.proc.wait(timeout=CLOSE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait()


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
    server = server_for(preload, server_env) if preload is not None and enabled() else None
    return _fork_or_start(server, CHILD_MODULE, argv, env, log_fd, log_fd, keep_fd, preload or ())


def start_process(module: str, argv: Sequence[str], env: Mapping[str, str], out_fd: int, err_fd: int) -> Child:
    """Start `module` with `argv` in a session of its own: forked from the server this process already forks from
    (`started`), else a fresh interpreter."""
    return _fork_or_start(started() if enabled() else None, module, argv, env, out_fd, err_fd, None, ())


def _fork_or_start(
    server: Connection | None,
    module: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    out_fd: int,
    err_fd: int,
    keep_fd: int | None,
    preload: Sequence[str],
) -> Child:
    """`module` with `argv` in a session of its own: forked from `server`, else (none, or it does not answer: said
    once) a fresh interpreter."""
    if server is not None:
        try:
            return server.spawn(argv, env, out_fd, keep_fd, module=module, err_fd=err_fd, preload=preload)
        except ServerGone as exc:
            log.warning("%s; %s runs as a fresh interpreter", exc, module)
            forget(server)
    return subprocess.Popen(
        command(argv, module),
        stdout=out_fd,
        stderr=err_fd,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        pass_fds=(keep_fd,) if keep_fd is not None else (),
        env=dict(env),
    )


# -- the server's side ------------------------------------------------------------------------------


def serve(control_fd: int, preload: Sequence[str]) -> int:
    """The server's loop: import `preload`, then fork a process per request and report how each ended.

    The control socket is the starter's connection; a process forked with a connection of its own asks
    over it too. When the control socket closes, every child is killed and the server exits; when another
    connection closes (its process ended or was killed), the children it asked for are killed.
    """
    die_with_parent(signal.SIGKILL)
    for name in (CHILD_MODULE, "setproctitle", *preload):
        importlib.import_module(name)
    control = socket.socket(fileno=control_fd)
    try:
        control.send(READY)
    except OSError:
        return 0  # the starter closed the server before it was ready (it ended, or has no more use for it)
    selector = selectors.DefaultSelector()
    selector.register(control, selectors.EVENT_READ)
    children: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, reply socket)
    asked: dict[socket.socket, set[int]] = {control: set()}  # connection -> pids of the children it asked for
    while True:
        for key, _ in selector.select():
            if isinstance(key.fileobj, socket.socket):
                connection = key.fileobj
                message, fds, _, _ = socket.recv_fds(connection, MESSAGE_MAX, 4)
                if not message and connection is control:
                    _end(children)
                    return 0
                if not message:
                    selector.unregister(connection)
                    _kill(asked.pop(connection))
                    connection.close()
                    continue
                pidfd, pid, reply, own = _fork(json.loads(message), fds)
                children[pidfd] = (pid, reply)
                asked[connection].add(pid)
                selector.register(pidfd, selectors.EVENT_READ)
                if own is not None:
                    asked[own] = set()
                    selector.register(own, selectors.EVENT_READ)
            else:
                pidfd = int(key.fileobj)
                selector.unregister(pidfd)
                pid, reply = children.pop(pidfd)
                _report(reply, {"rc": os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])})
                os.close(pidfd)
                for pids in asked.values():
                    pids.discard(pid)


def _fork(request: dict[str, Any], fds: list[int]) -> tuple[int, int, socket.socket, socket.socket | None]:
    """Fork the requested process; (its pidfd, its pid, the reply socket, the server's end of its own connection or
    None) once it is told the pid."""
    reply, out_fd, err_fd, keep_fd = socket.socket(fileno=fds[0]), fds[1], fds[2], (fds[3] if len(fds) > 3 else None)
    for name in request.get("preload", ()):
        _import(name)
    own, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) if request.get("client") else (None, None)
    sys.stdout.flush()
    sys.stderr.flush()
    started, announce = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(started)
        if own is not None:
            own.close()
        _become_child(request, out_fd, err_fd, keep_fd, theirs, announce)
    os.close(announce)
    if theirs is not None:
        theirs.close()
    os.read(started, 1)  # the child leads its own process group now (or died): a kill of the group reaches it
    os.close(started)
    for fd in {out_fd, err_fd}:
        os.close(fd)
    if keep_fd is not None:
        os.close(keep_fd)  # the child holds it now
    pidfd = os.pidfd_open(pid)
    _report(reply, {"pid": pid})
    return pidfd, pid, reply, own


def _import(name: str) -> None:
    """Import `name` into the server, for every process it forks later; a module that fails to import is left to the
    child, which fails on it as a fresh interpreter would."""
    if name not in sys.modules:
        try:
            importlib.import_module(name)
        except Exception:
            log.debug("the server could not import %s", name, exc_info=True)


def _report(reply: socket.socket, message: dict[str, int]) -> None:
    try:
        reply.send(json.dumps(message).encode())
    except OSError:
        pass  # the starter is gone: nobody to tell
    if "rc" in message:
        reply.close()


def _kill(pids: set[int]) -> None:
    """Kill the process groups of `pids` (their reports follow as they are reaped)."""
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _end(children: dict[int, tuple[int, socket.socket]]) -> None:
    """The starter closed the control socket: its children have nobody left to report to."""
    _kill({pid for pid, _ in children.values()})
    for pid, _ in children.values():
        os.waitpid(pid, 0)


def _become_child(
    request: dict[str, Any],
    out_fd: int,
    err_fd: int,
    keep_fd: int | None,
    connection: socket.socket | None,
    announce: int,
) -> NoReturn:
    """In the forked process: become what `python -m MODULE ARGV` would be, run it, exit.

    `announce` is closed once the process leads its own session, before the server tells the starter its pid.
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
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        kept = {fd for fd in (keep_fd, connection.fileno() if connection is not None else None) if fd is not None}
        _close_all_but(kept)  # nothing of the server's: its sockets, other children's descriptors
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update({**request["env"], PARENT_ENV: str(server), STARTER_ENV: request["env"].get(PARENT_ENV, "")})
        keep_env = request.get("keep_env", STARTUP_HOLD_ENV)
        os.environ.pop(keep_env, None)
        if keep_fd is not None:
            os.environ[keep_env] = str(keep_fd)
        if connection is not None:
            _INHERITED[:] = [Connection(connection)]
        _reseed()
        module = request.get("module", CHILD_MODULE)
        if module not in ENTRIES:
            raise ValueError(f"not a process the server starts: {module}")
        rc = importlib.import_module(module).main(list(request["argv"]))
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


def _close_all_but(kept: set[int]) -> None:
    """Close every descriptor from 3 up but those in `kept`."""
    low = 3
    for fd in sorted(kept):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, os.sysconf("SC_OPEN_MAX"))


def _reseed() -> None:
    """A fresh process draws fresh random numbers: reseed NumPy's global generator (`random` reseeds itself at fork)."""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
