"""The embedded default backend: bubblewrap + cgroupfs + a runtime-built seccomp program.

Modules by responsibility: ``records`` (the state store), ``bwrap`` (argv and the
shared /etc), ``privilege`` (a root worker's drop before bwrap), ``process`` (start one
spawn inside the cgroups, signal its tree), ``backend`` (``LocalBackend``,
``LocalSandbox``).

Each sandbox is a cgroup set (memory/pids/cpu limits, see ``cgroups``) and a JSON record
in a state directory, which also holds the small ``/etc`` all sandboxes share (generated
users, a few copied host files). Each ``spawn`` runs one ``bwrap`` that unshares every
namespace (so no network: the new net namespace has only loopback), maps the agent to
uid/gid 1000 without capabilities, mounts ``/usr`` and that ``/etc`` read-only, the
workspace read-write and the pack closure read-only, the spec's ``state_mounts``
read-write over the private HOME tmpfs (bubblewrap makes their missing parents there,
owned by the sandbox user), and installs the seccomp program before exec.

The record makes ``list`` and ``destroy`` work from another process (a reaper after the
worker died): destroy needs only the record's cgroup paths, never the worker's memory.

The sandbox uid 1000 maps to the host uid bubblewrap runs as. A root worker never lets
that be root: each spawn enters the sandbox's staging mount namespace (see ``staging``)
and drops to ``sandbox_host_uid``/``sandbox_host_gid`` with ``nsenter`` (no groups, no
capabilities; see ``privilege``) before exec'ing bubblewrap, which then builds
an unprivileged user namespace. The worker moves each spawn into the cgroups itself while
bubblewrap starts: bubblewrap waits for its options on a pipe the worker fills only then,
so it clones the sandbox inside them (whose cgroup namespace is rooted at its own cgroup),
and the sandboxed child also waits on a gate (``--block-fd``) until it is in, so the
program never runs a single instruction outside them (see ``process``). Files the
agent writes are owned by that uid on the host, and a host file it cannot read as that
uid stays unreadable. The workspace must therefore be owned by that uid (``create``
refuses otherwise; ``stage_owner()`` tells a runner whom to stage it for). A non-root
worker runs bubblewrap as itself. The seccomp program still refuses set-id mode bits.

Agent config paths (``worker.admission.mask_plan``) are masked for the whole run: the
``.cursor``/``.claude`` directories bound onto themselves (so they cannot be renamed;
``.codex`` is masked whole, as an empty read-only directory),
``/dev/null`` bound read-only over each config file (a character device on a ``nodev``
mount: it is not a regular file, and every open fails), an empty read-only directory over
each plugin directory. Missing mount points are made before the run (``mountpoints``),
recorded, and removed by ``destroy``.

Network ``allowlist`` (see ``netpolicy``): bubblewrap still unshares the network
namespace; the job's proxy socket and the forwarder script are bound read-only at
``/run/acpw``, each spawn runs behind the forwarder (``127.0.0.1:3128`` on the sandbox's
own loopback) with the proxy variables added to its environment, and ``destroy`` closes
the proxy.
"""

from worker.sandbox.local.backend import DEFAULT_STAGE_DIR, LocalBackend, LocalSandbox
from worker.sandbox.local.bwrap import BindSources, HostLayout, build_bwrap_options
from worker.sandbox.local.process import LocalProcess, descendants
from worker.sandbox.local.records import DEFAULT_STATE_DIR, LocalSandboxStatus, SandboxRecord

__all__ = [
    "DEFAULT_STAGE_DIR",
    "DEFAULT_STATE_DIR",
    "BindSources",
    "HostLayout",
    "LocalBackend",
    "LocalProcess",
    "LocalSandbox",
    "LocalSandboxStatus",
    "SandboxRecord",
    "build_bwrap_options",
    "descendants",
]
