"""How function instances start: the launch paths, behind one small handle interface.

A pool talks to an instance only through :class:`InstanceHandle`: ``call(method, *args)`` returns
a future, ``kill()`` stops the process. Two launch paths implement it (:data:`LAUNCHERS`):

- ``process`` (the paper's condition): every instance is a new Ray actor process that imports
  the runtime, loads the model and opens the store. Ray starts the worker through a shell wrapper
  (``runtime_env`` ``py_executable``) that joins the instance's memory and CPU cgroups *before*
  it execs Python, so everything the process ever touches, the runtime included, is charged to
  the instance as a container's memory is.
- ``fork`` (:mod:`.fork`): an instance is forked from a warm template process of its function.

Either way the instance's cgroups are created here, on the launching side, and removed when the
instance is retired (:meth:`InstanceHandle.kill`), so nothing outlives its owner.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import shlex
import shutil
import sys
from concurrent.futures import Future
from typing import Any

from gnnserve.deploy.faas.cgroup import MemoryCgroup, cgroup_support
from gnnserve.deploy.faas.function import FunctionSpec, scratch_dir
from gnnserve.deploy.faas.resources import CPU_GROUP, Resources
from gnnserve.deploy.fog.testbed import CpuQuota
from gnnserve.errors import GnnServeError
from gnnserve.registry import Registry

log = logging.getLogger(__name__)
_MB = 1 << 20


class InstanceDiedError(GnnServeError):
    """The instance process is gone (killed for memory, crashed, stopped)."""

    kind = "instance_died"


class KilledForMemoryError(InstanceDiedError):
    """The instance process was killed by the kernel for memory (its memory cgroup counted
    the kill)."""


class InstanceHandle(abc.ABC):
    """One running (or starting) instance, as a pool sees it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._groups: list[MemoryCgroup | CpuQuota] = []

    @abc.abstractmethod
    def call(self, method: str, *args: Any) -> Future[Any]:
        """Run ``method(*args)`` on the instance; the future fails with
        :class:`InstanceDiedError` when the process dies first."""

    @abc.abstractmethod
    def _stop(self) -> None:
        """Kill the process (no-op when it is gone)."""

    def oom_kills(self) -> int:
        """Times the kernel killed a process of this instance for memory (its memory cgroup's
        counter; 0 without one)."""
        kills = 0
        for group in self._groups:
            if isinstance(group, MemoryCgroup):
                with contextlib.suppress(OSError):
                    kills += group.oom_kills
        return kills

    def kill(self) -> None:
        """Stop the process and remove its cgroups and scratch files (its owner's resources)."""
        with contextlib.suppress(Exception):
            self._stop()
        shutil.rmtree(scratch_dir(self.name), ignore_errors=True)
        for group in self._groups:
            try:
                if isinstance(group, MemoryCgroup):
                    group.remove(timeout_s=5.0)
                else:
                    group.close(timeout_s=5.0)
            except Exception as exc:  # noqa: BLE001 - left for cleanup_stale, logged
                log.warning("instance %s: cgroup %s not removed: %s", self.name, group, exc)


class Launcher(abc.ABC):
    """Starts instances of one service (``tag``: the service's id); :meth:`close` ends what it
    started. ``uses_ray``: its instances are Ray actors (the service starts Ray for them)."""

    uses_ray = False

    def __init__(self, tag: str) -> None:
        self.tag = tag

    def prepare(self, kind: str, spec: FunctionSpec) -> None:  # noqa: B027 - optional hook
        """Get ready to launch ``kind`` instances of ``spec`` quickly (deployment start-up)."""

    def wait_ready(self) -> None:  # noqa: B027 - optional hook
        """Block until what :meth:`prepare` started is ready."""

    @abc.abstractmethod
    def launch(
        self, kind: str, spec: FunctionSpec, name: str, resources: Resources
    ) -> InstanceHandle:
        """Start instance ``name``; returns at once (``call("ready")`` waits for it)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Stop what the launcher itself runs (templates)."""


LAUNCHERS: Registry[Launcher] = Registry("launch")


def make_groups(name: str, resources: Resources) -> list[MemoryCgroup | CpuQuota]:
    """The memory and CPU cgroups of instance ``name`` (none where cgroups are unavailable)."""
    groups: list[MemoryCgroup | CpuQuota] = []
    reason = cgroup_support()
    if reason is not None:
        if resources.memory_mb or resources.cpus:
            log.warning("instance %s runs without limits: %s", name, reason)
        return groups
    if resources.memory_mb:
        groups.append(MemoryCgroup(name, resources.memory_mb * _MB))
    if resources.cpus:
        groups.append(CpuQuota(name, resources.cpus, group=CPU_GROUP))
    return groups


def join_script(paths: list[str]) -> str:
    """A ``py_executable`` for Ray: a shell that moves itself into each cgroup directory of
    ``paths`` (created if missing, e.g. on another host), then execs this Python."""
    join = "".join(
        f"mkdir -p {shlex.quote(p)} && echo $$ > {shlex.quote(p)}/cgroup.procs && " for p in paths
    )
    script = join + 'exec "$0" "$@"'
    return f"/bin/sh -c {shlex.quote(script)} {shlex.quote(sys.executable)}"


class RayInstance(InstanceHandle):
    """An instance running as a Ray actor."""

    def __init__(self, name: str, actor: Any, groups: list[MemoryCgroup | CpuQuota]) -> None:
        super().__init__(name)
        self.actor = actor
        self._groups = groups

    def call(self, method: str, *args: Any) -> Future[Any]:
        out: Future[Any] = Future()
        ref = getattr(self.actor, method).remote(*args)
        ref.future().add_done_callback(lambda f: _translate(f, out))
        return out

    def _stop(self) -> None:
        import ray

        ray.kill(self.actor, no_restart=True)


def _translate(ray_future: Future[Any], out: Future[Any]) -> None:
    """Ray's outcome as ours: a dead actor is :class:`InstanceDiedError`, a task error its cause."""
    import ray

    try:
        out.set_result(ray_future.result())
    except ray.exceptions.RayActorError as exc:
        out.set_exception(InstanceDiedError(_first_line(exc), "instance"))
    except ray.exceptions.RayTaskError as exc:
        cause = exc.cause if isinstance(exc.cause, BaseException) else exc
        out.set_exception(cause)
    except BaseException as exc:  # noqa: BLE001 - handed on as the call's outcome
        out.set_exception(exc)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__


@LAUNCHERS.register("process")
class ProcessLauncher(Launcher):
    """Each instance a fresh Ray actor process, charged to its cgroups from its first byte."""

    uses_ray = True

    def launch(
        self, kind: str, spec: FunctionSpec, name: str, resources: Resources
    ) -> InstanceHandle:
        from gnnserve.deploy.faas.instance import RemoteInstance

        groups = make_groups(name, resources)
        options: dict[str, Any] = {}
        if groups:
            paths = [str(g.path) for g in groups]
            options["runtime_env"] = {"py_executable": join_script(paths)}
        actor = RemoteInstance.options(**options).remote(kind, spec, name, resources)
        return RayInstance(name, actor, groups)
