"""Start, watch and stop SGLang servers for a run: one process group per server, never orphaned.

Backends stage. Consumes a model directory, a port and a launch recipe (``"cpu"``, ``"gpu"`` or
a command template); produces a running :class:`SGLangServer` whose ``url`` answers
``/health``. It knows nothing about training, policies or LoRA: which servers a run starts, and
for which policies, is ``sglang_fleet.py``'s plan (extra flags, such as a LoRA base's, are
appended to :func:`launch_command`'s argv there); the trainer stops them all in a ``finally``.

How no server is ever left behind:

* each server is started in a **new session** (its own process group), so ``stop`` signals the
  launcher and every process it forked (SGLang's scheduler and detokenizer) with one ``killpg``;
* every started server is registered; an ``atexit`` hook stops what is still registered when
  the interpreter exits (normal end, an uncaught exception, ``sys.exit``, Ctrl-C);
* the child asks the kernel (``prctl(PR_SET_PDEATHSIG, SIGTERM)``) to be sent SIGTERM when the
  process that started it dies, so even a trainer killed with SIGKILL takes its servers down
  (SGLang's launcher then stops its own children);
* ``stop`` also removes the shared memory SGLang leaves in /dev/shm (a 270 MB buffer a server on
  AMX machines: Note [A server's shared memory]);
* a server that exits while starting is reported with the tail of its log and the class of its
  failure (a signal such as SIGILL, a missing venv, a taken port, a model it cannot load:
  ``sglang_start.py``).

Recipes (``{model}``, ``{port}``, ``{host}`` and ``{python}`` are filled in):

* ``"cpu"``: this repository's CPU recipe, the flags of ``shared/sglang-cpu/launch.sh`` (bf16,
  ``torch_native`` attention, no overlap schedule, 65,536-token KV cache) and ``--sleep-on-idle``
  (an idle scheduler otherwise spins a whole core, taken from the trainer between rollouts) and
  ``--skip-server-warmup`` (SGLang's ``/health``, which :meth:`SGLangServer.wait_healthy` polls,
  generates a token itself -- :data:`CPU_ENV` keeps it so -- so a healthy answer has already proved
  a forward pass; the warmup request before it cost ~1 s of every start; a fault of the tokenizer or
  detokenizer process now shows at the first request, not at the start), with the SGLang venv's python
  (``SRPO_GRAPH_SGLANG_PYTHON``, default ``~/.cache/srpo-graph/sglang-venv/bin/python``);
  Its entry point is ``sglang_cpu_main.py``: ``sglang.launch_server`` whose scheduler and
  detokenizer are forked from the launcher instead of spawned, so they do not import SGLang again
  (Note [The cpu recipe forks SGLang's processes]: a start 1.6x faster, 2.4x less CPU);
* ``"gpu"``: ``python -m sglang.launch_server`` with SGLang's defaults;
* anything else: a command template, split like a shell would (no shell runs it).

Every recipe adds ``--enable-custom-logit-processor`` (``allow:`` needs it, see
``sglang.py``) unless the template already has it.

The launched server is the one answering (issue 23, item 1): a port left unset is a free one
(:func:`launch_ports`), a given port already in use is refused naming it, and every launch carries
a per-launch token (``--served-model-name srpo-graph-<token>``) that :meth:`SGLangServer.wait_healthy`
finds in the answering server's ``/server_info`` -- another process answering on the port (its
own server failed to bind) stops the run before anything is sent to it. Servers a run did not
launch (``url``/``urls``) get no weight updates unless ``rollout.sglang.update_connected`` says so
(``sglang_fleet.refuse_connected``).
"""

from __future__ import annotations

import atexit
import os
import secrets
import shlex
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Sequence

from srpo_graph.backends import bounded_http
from srpo_graph.backends.ports import release
from srpo_graph.backends.sglang_start import cannot_launch, exited_while_starting, read_tail
from srpo_graph.errors import BackendError

DEFAULT_VENV = Path.home() / ".cache" / "srpo-graph" / "sglang-venv"
# the cpu recipe's entry point: SGLang's launcher with its scheduler and detokenizer forked, not
# spawned (Note [The cpu recipe forks SGLang's processes], sglang_cpu_main.py)
CPU_MAIN = Path(__file__).with_name("sglang_cpu_main.py")
_CPU_MAIN_ARG = shlex.quote(str(CPU_MAIN)).replace("{", "{{").replace("}", "}}")  # a literal in the template
CPU_TEMPLATE = ("{python} " + _CPU_MAIN_ARG + " --model-path {model} --host {host} --port {port} "
                "--device cpu --dtype bfloat16 --attention-backend torch_native --disable-overlap-schedule "
                "--max-total-tokens 65536 --sleep-on-idle --skip-server-warmup")
GPU_TEMPLATE = "{python} -m sglang.launch_server --model-path {model} --host {host} --port {port}"
PRESETS = {"cpu": CPU_TEMPLATE, "gpu": GPU_TEMPLATE}
# The cpu recipe's environment. SGLang's crash diagnostics (py-spy of the schedulers, CUDA core
# dumps) are GPU tools; left on, every stop of a CPU server (SIGTERM to its process group, which
# its launcher reads as a crashed scheduler) sleeps 5 s "to let GPU activity settle" first.
# `/health` generating a token is SGLang's default; set here, since the recipe skips the warmup
# request and counts on it (an environment that turned it off would make "healthy" mean "listening").
CPU_ENV = {"SGLANG_USE_CPU_ENGINE": "1", "SGLANG_PYSPY_DUMP_BEFORE_CRASH": "0",
           "SGLANG_CUDA_COREDUMP_BEFORE_CRASH": "0", "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "1"}
CUSTOM_LOGIT_FLAG = "--enable-custom-logit-processor"
TOKEN_FLAG = "--served-model-name"  # carries the per-launch token, read back from /server_info

_LIVE: dict[int, "SGLangServer"] = {}
_LIVE_LOCK = threading.Lock()


def recipe_env(recipe: str) -> dict[str, str]:
    """The environment a server launched with ``recipe`` gets on top of this process's.

    >>> recipe_env("cpu")["SGLANG_USE_CPU_ENGINE"], recipe_env("gpu")
    ('1', {})
    """
    return dict(CPU_ENV) if recipe == "cpu" else {}


def sglang_python() -> str:
    """The python that has SGLang: ``$SRPO_GRAPH_SGLANG_PYTHON`` or the default CPU venv's."""
    return os.environ.get("SRPO_GRAPH_SGLANG_PYTHON") or str(DEFAULT_VENV / "bin" / "python")


def launch_command(recipe: str, model: str, port: int, host: str = "127.0.0.1", python: str | None = None) -> list[str]:
    """The argv that starts one server.

    Args:
        recipe: ``"cpu"``, ``"gpu"`` or a template with ``{model}``, ``{port}`` (and optionally
            ``{host}``, ``{python}``).
        model: the model directory (or hub name) to serve.
        port: its port.
    Raises:
        BackendError: a template without ``{model}`` or ``{port}``, or with unknown fields.

    >>> launch_command("gpu", "/m", 30001, python="py")[:4]
    ['py', '-m', 'sglang.launch_server', '--model-path']
    >>> launch_command("gpu", "/m", 30001, python="py")[-1]
    '--enable-custom-logit-processor'
    >>> launch_command("serve {model}", "/m", 1)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    srpo_graph.errors.BackendError: field `rollout.sglang.launch`: ... must contain {model} and {port}
    """
    template = PRESETS.get(recipe, recipe)
    if "{model}" not in template or "{port}" not in template:
        raise BackendError(
            f"field `rollout.sglang.launch`: the launch command {recipe!r} must contain {{model}} and {{port}}"
        )
    try:
        argv = [
            part.format(model=model, port=int(port), host=host, python=python or sglang_python())
            for part in shlex.split(template)
        ]
    except (KeyError, IndexError, ValueError) as exc:
        raise BackendError(
            f"field `rollout.sglang.launch`: cannot fill the launch command {recipe!r}: {exc!r} "
            "(known fields: {model} {port} {host} {python})"
        ) from None
    if CUSTOM_LOGIT_FLAG not in argv:
        argv.append(CUSTOM_LOGIT_FLAG)
    return argv


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not Linux: atexit and the process group still stop it
        pass


_TORCHRUN_ENV = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def server_environ() -> dict[str, str]:
    """This process's environment without torchrun's rendezvous variables: a server launched by
    rank 0 of a torchrun job would otherwise join the job's store (``TORCHELASTIC_USE_AGENT_STORE``,
    ``MASTER_PORT``) when it makes its own process group, and wait there for ever.

    >>> os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "True"
    >>> out = server_environ(); del os.environ["TORCHELASTIC_USE_AGENT_STORE"]
    >>> "TORCHELASTIC_USE_AGENT_STORE" in out
    False
    """
    return {k: v for k, v in os.environ.items() if k not in _TORCHRUN_ENV and not k.startswith("TORCHELASTIC_")}


class SGLangServer:
    """One SGLang server process (group) on ``host:port``.

    Args:
        argv: the command (see :func:`launch_command`).
        port: the port it listens on.
        host: its address (loopback by default).
        log_path: where its stdout/stderr go.
        env: extra environment (the cpu recipe's is :func:`recipe_env`).
    """

    def __init__(
        self,
        argv: Sequence[str],
        port: int,
        *,
        host: str = "127.0.0.1",
        log_path: str | Path | None = None,
        env: dict[str, str] | None = None,
    ):
        self.argv = list(argv)
        self.port = int(port)
        self.host = host
        self.url = f"http://{host}:{self.port}"
        self.log_path = Path(log_path) if log_path else Path(f"/tmp/srpo-graph-sglang-{self.port}.log")
        self.env = dict(env or {})
        self.proc: subprocess.Popen | None = None
        self._shared: set[Path] = set()  # SGLang's /dev/shm files, noted once healthy (Note [A server's shared memory])
        self.token: str | None = None
        if TOKEN_FLAG in self.argv[:-1]:  # the template names the model itself: that name identifies it
            self.token = self.argv[self.argv.index(TOKEN_FLAG) + 1]
        elif not any("sglang_router" in a for a in self.argv):
            # every launch but sglang-router's (its launcher has no such flag and serves no model itself)
            self.token = f"srpo-graph-{secrets.token_hex(8)}"
            self.argv += [TOKEN_FLAG, self.token]

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> "SGLangServer":
        """Start the process in its own session; register it for the exit hook."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**server_environ(), **self.env}
        with open(self.log_path, "ab") as log:
            try:
                self.proc = subprocess.Popen(
                    self.argv,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    start_new_session=True,
                    preexec_fn=_die_with_parent,
                )
            except OSError as exc:
                raise cannot_launch(self.argv, exc, sglang_python()) from None
        with _LIVE_LOCK:
            _LIVE[self.proc.pid] = self
        return self

    def log_tail(self, lines: int = 15) -> str:
        return read_tail(self.log_path, lines)

    def wait_healthy(self, timeout: float = 300.0) -> "SGLangServer":
        """Poll ``/health`` until it answers 200.

        Raises:
            BackendError: the process exited, or ``timeout`` seconds passed (the server is stopped).
        """
        deadline = time.monotonic() + timeout
        probe = bounded_http.client(concurrency=1)
        try:
            return self._poll_health(probe, deadline, timeout)
        finally:
            probe.close()

    def _poll_health(self, probe: Any, deadline: float, timeout: float) -> "SGLangServer":
        import httpx

        while True:
            if self.proc is not None and self.proc.poll() is not None:
                code = self.proc.returncode
                self.stop(grace=5.0)  # its children (scheduler, detokenizer) may outlive the launcher
                raise exited_while_starting(self.url, code, self.log_path)
            try:
                healthy = bounded_http.call(probe, "GET", f"{self.url}/health", timeout=5.0,
                                            max_bytes=bounded_http.CONTROL_LIMIT, why="a health check").status == 200
            except (httpx.HTTPError, BackendError):
                healthy = False
            if healthy:
                return self._verify_identity(probe)
            if time.monotonic() > deadline:
                self.stop()
                raise BackendError(
                    f"sglang: the server for {self.url} was not healthy after {timeout:g}s (stopped it); "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(0.5)

    def _verify_identity(self, probe: Any) -> "SGLangServer":
        """The server answering on the port must be this launch's: its ``/server_info`` holds the token.

        Raises:
            BackendError: another process answers there (this launch's process is stopped).
        """
        import httpx

        if self.token is None:  # sglang-router: no model of its own, nothing to compare
            return self
        text = ""
        for route in ("/server_info", "/get_server_info"):
            try:
                answer = bounded_http.call(probe, "GET", f"{self.url}{route}", timeout=10.0,
                                           max_bytes=bounded_http.CONTROL_LIMIT, why=f"the route {route}")
            except (httpx.HTTPError, BackendError):
                continue
            if answer.status == 200:
                text = answer.text
                break
        if self.token in text:
            self._shared = self.shared_memory()  # (noted now too: a server killed outside ``stop`` has no maps left)
            return self
        mine = "exited" if self.proc is not None and self.proc.poll() is not None else "was stopped"
        self.stop()
        raise BackendError.at(
            f"field `rollout.sglang.port` ({self.port})",
            f"the server answering on {self.url} is not the one this run launched (its /server_info lacks this "
            f"launch's token {self.token}): another process holds port {self.port}, and this run's server {mine} "
            f"(log {self.log_path})",
            why="training would sample from and push weight updates into someone else's server",
            fix="leave rollout.sglang.port unset (a free port is picked), or choose a free one",
        )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def shared_memory(self) -> set[Path]:
        """The files of SGLang's own under /dev/shm that this server's processes have mapped now
        (Note [A server's shared memory]); empty when it is not running."""
        if self.proc is None:
            return set()
        try:
            pgid = os.getpgid(self.proc.pid)
        except ProcessLookupError:
            pgid = self.proc.pid
        return _group_shared_memory(pgid)

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM the whole process group, SIGKILL what is left after ``grace`` seconds, then remove
        the shared memory it leaves behind (Note [A server's shared memory]). Idempotent."""
        proc = self.proc
        if proc is None:
            release([self.port])  # never started: its claimed port is free to hand out again
            return
        try:
            pgid: int | None = os.getpgid(proc.pid)
        except ProcessLookupError:  # the launcher is gone; its session's group (id = its pid) may not be
            pgid = proc.pid if _group_alive(proc.pid) else None
        shared = self._shared | (_group_shared_memory(pgid) if pgid is not None else set())
        for sig, wait_s in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            if pgid is not None:
                try:
                    os.killpg(pgid, sig)
                except ProcessLookupError:
                    break
            elif proc.poll() is None:
                proc.send_signal(sig)
            try:
                proc.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                continue
            if pgid is None or not _group_alive(pgid):
                break
        for path in shared:  # (a name unlinked while a dying process still maps it: its pages go with the mapping)
            path.unlink(missing_ok=True)
        self._forget()
        release([self.port])  # a port this process claimed for it (launch_ports) is free to hand out again

    def _forget(self) -> None:
        with _LIVE_LOCK:
            if self.proc is not None:
                _LIVE.pop(self.proc.pid, None)

    def __enter__(self) -> "SGLangServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# Note [A server's shared memory]
#     SGLang's CPU kernels keep a 270 MB all-reduce buffer in /dev/shm for each scheduler
#     (``deepspeed_allreduce_buffer_*``, seen with the x86-64-v4 AMX build), beside small
#     ``sglang_loads_*`` files, and never remove them: every start of a server left 270 MB in a
#     tmpfs, which is memory. A machine that started ~80 servers (a few test runs) had 21 GB of them,
#     and its next run was killed by the OOM killer. So ``stop`` notes the files of SGLang's own
#     under /dev/shm (by name, directly in it) that the server's processes have mapped
#     (/proc/PID/maps) once it is healthy and again at the stop (a server killed outside ``stop``
#     has no maps left to read), and unlinks them once the group has been signalled (a group
#     of zombies still counts as alive where PID 1 reaps late, as in these sandboxes). It removes only
#     mapped files of these names: a user's weight folder under /dev/shm is never touched. A server
#     whose trainer was killed with SIGKILL (PR_SET_PDEATHSIG stops it, not ``stop``) still leaves
#     its files.
_SHM = Path("/dev/shm")
_SGLANG_SHM_PREFIXES = ("deepspeed_allreduce_buffer", "sglang_")


def _group_shared_memory(pgid: int) -> set[Path]:
    """SGLang's files directly under /dev/shm that a live process of group ``pgid`` has mapped."""
    found: set[Path] = set()
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit():
            continue
        try:
            if os.getpgid(int(entry)) != pgid:
                continue
            with open(f"/proc/{entry}/maps", encoding="utf-8", errors="replace") as maps:
                for line in maps:
                    fields = line.rstrip("\n").split(maxsplit=5)
                    path = Path(fields[5].removesuffix(" (deleted)")) if len(fields) == 6 else None
                    if path is not None and path.parent == _SHM and path.name.startswith(_SGLANG_SHM_PREFIXES):
                        found.add(path)
        except (OSError, ValueError):  # a process that ended meanwhile, or one not ours to read
            continue
    return found


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def start_server(
    model: str,
    port: int,
    *,
    recipe: str = "cpu",
    host: str = "127.0.0.1",
    log_path: str | Path | None = None,
    health_timeout: float = 300.0,
) -> SGLangServer:
    """Launch a server on ``model`` at ``host:port`` and wait until it is healthy.

    Raises:
        BackendError: it cannot start, exits, or is not healthy in time (nothing is left running).
    """
    argv = launch_command(recipe, model, port, host)
    server = SGLangServer(argv, port, host=host, log_path=log_path, env=recipe_env(recipe)).start()
    try:
        return server.wait_healthy(health_timeout)
    except BaseException:
        server.stop()
        raise


def launch_ports(first: int | None, count: int, host: str = "127.0.0.1") -> list[int]:
    """Ports for ``count`` launched servers: ``first + i`` when given (each must be free and not
    claimed by another process), else claimed free ones (:func:`srpo_graph.backends.ports.claim_ports`:
    no other run or test worker on this machine is handed the same port while a server starts).

    Raises:
        ConfigError: a given port is in use or claimed, named.
    """
    from srpo_graph.backends.ports import claim, claim_ports, port_in_use, release
    from srpo_graph.errors import ConfigError

    if first is None:
        return claim_ports(count, host)
    ports = [int(first) + i for i in range(count)]
    taken = [p for p in ports if port_in_use(p, host)]
    if taken:
        raise ConfigError.at(
            f"field `rollout.sglang.port` ({first})",
            f"port {taken[0]} on {host} is already in use (another server -- maybe another run's "
            "SGLang -- listens there)",
            why="a launched server that cannot bind its port would leave training talking to the other one",
            fix="leave rollout.sglang.port unset (free ports are picked), or choose a free one",
        )
    claimed = [p for p in ports if claim(p)]
    if len(claimed) < len(ports):
        release(claimed)
        other = next(p for p in ports if p not in claimed)
        raise ConfigError.at(
            f"field `rollout.sglang.port` ({first})",
            f"port {other} on {host} is claimed by another srpo-graph process on this machine (a server "
            "it launched is starting there)",
            why="two servers launched on one port: one of them fails, and training could talk to the other",
            fix="leave rollout.sglang.port unset (free ports are picked), or choose another",
        )
    return ports


def stop_all() -> None:
    """Stop every server this process started and has not stopped (the exit hook)."""
    with _LIVE_LOCK:
        servers = list(_LIVE.values())
    for s in servers:
        s.stop(grace=10.0)


def live_servers() -> list[SGLangServer]:
    with _LIVE_LOCK:
        return list(_LIVE.values())


atexit.register(stop_all)
