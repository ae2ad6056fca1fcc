"""The docker backend: one container per spawn, on any Docker-API engine (Docker, Podman).

``create`` picks the image and pre-creates the sandbox's first container (not started):

- a closure from the pack cache (``<cache_dir>/closures/<digest>``, verified by the
  runner just before) runs from its *pack image* — reused by identity, built when
  missing (``worker.images``) — which holds the closure at ``PACK_ROOT``;
- any other closure directory (tests, development) is bind-mounted read-only at
  ``PACK_ROOT`` over the base image.

``spawn`` attaches to the container's stdin/stdout/stderr *before* starting it (no
output is lost), checks the image against its pin (``image_mismatch`` otherwise),
starts it and sends the launch header — argv, cwd and the complete environment — over
stdin to a tiny launcher that ``execve``\\ s the program. The environment therefore never
enters the container's configuration (``docker inspect`` shows no credentials).
stdout/stderr arrive multiplexed in 8-byte-framed chunks and are split here.

Every container: user 1000:1000, read-only root filesystem, tmpfs HOME and /tmp, the
workspace bind-mounted read-write, ``extra_mounts`` read-only, ``state_mounts`` read-write
over the HOME tmpfs (each missing parent below HOME gets its own tmpfs owned by the
sandbox user, as the engine would make it root-owned), ``cap_drop=ALL``,
``no-new-privileges``, the engine's default seccomp profile, pids /
memory (no swap) / CPU limits, network ``none``, an init process (so SIGTERM reaches the
program with its default action), no log driver (output is not kept on disk), and the
labels job, attempt, token, worker plus ``acpw.sandbox`` (the sandbox id), so
``list``/``destroy`` work from any process. Podman's ``OOMKilled`` is unreliable: an
exit status 137 that this backend did not cause is reported as an OOM kill (by
``DockerProcess.exit_diagnosis`` too, which also asks the engine's ``OOMKilled``).

Agent config paths (``worker.admission.mask_plan``) are masked as in the local backend:
the ``.cursor``/``.claude`` directories bound onto themselves (a mount point cannot be
renamed or removed: EBUSY; ``.codex`` is masked whole, as an empty read-only directory),
``/dev/null`` bound read-only over each config file (with ``nodev`` on Podman, so every
open fails; Docker's bind options have no ``nodev``, so there the device opens, reads
empty and swallows writes — never a regular file), and a
read-only empty tmpfs over each plugin directory. Missing mount points are made in the
host workspace before the first container (``mountpoints``), and what was made is
recorded in the container labels ``acpw.mask_points``/``acpw.workspace`` so ``destroy``
from any process removes exactly those, after the containers are dead.

Right before launch the runner calls ``admission_view``: it starts the next container
ahead of its spawn (the launcher waits for the header) and runs the admission check in
that container's mount view, ``/proc/<init pid>/root`` (``worker.sandbox.view``; the
engine must run on this host). The spawn then uses that container and its attach socket.

``workspace_files`` serves artifacts, prompt links and the client's ``fs/*`` from the
staged host directory every container binds at ``/workspace`` (owned by the sandbox user
since ``create``), with the same masks refused, but only once a running container of the
sandbox was seen, through ``/proc/<pid>/root``, to show that very directory there
(``admission_view`` proves it before the launch); until then every path is refused
``workspace_not_reachable``.

Network ``allowlist`` works as in the local backend (``netpolicy``): the container keeps
network mode ``none`` (loopback only); the job's proxy socket and the forwarder script
are bound read-only at ``/run/acpw``, the launch header runs the program behind the
forwarder with the proxy variables added, and ``destroy`` closes the proxy (in this
process) and removes its directory (label ``acpw.proxy_dir``, from any process).

Warm slots (``SlotHost``): a slot is a sandbox created for no job, its agent's container
running. ``assign`` makes it an attempt's: as a container's labels are fixed at its
creation, it creates the sandbox's next container with the attempt's labels, and a
sandbox is listed with its newest container's labels (named ``<sandbox id>-<n>``), so
every process that reaches the engine (a reaper) judges it by the attempt's lease, as a
cold one; the running containers get the attempt's lease watchdog, as ``spawn`` gives
each container it starts. ``fill`` gives the staged copy to the sandbox user and moves
it into the bound host workspace (``hostfill``); re-admission then checks the running
agent's container's view.
"""

from worker.sandbox.docker.backend import DockerBackend, DockerSandbox
from worker.sandbox.docker.containers import LABEL_SANDBOX
from worker.sandbox.docker.process import DockerProcess
from worker.sandbox.launcher import exit_status, launch_header

__all__ = [
    "LABEL_SANDBOX",
    "DockerBackend",
    "DockerProcess",
    "DockerSandbox",
    "exit_status",
    "launch_header",
]
