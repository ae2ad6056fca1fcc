"""The daytona backend: a Daytona sandbox per job attempt, through the official SDK.

Images: a Daytona snapshot per pack image and resources, named by our content identity of
the pack image (``acpw-<identity hex[:40]>-c<cpus>m<GiB>``; never by an
``image@sha256:`` reference, which Daytona rewrites), made on demand from
``<ACPW_DAYTONA_IMAGE_REGISTRY>/acpw-pack:<identity hex>`` (what ``acp-worker image``
pushes), reused when present and verified before use: its recorded image must be that
reference, which carries the identity.

Sandboxes: one per job attempt, named by our sandbox id, with our labels (job, attempt,
lease token, worker, owner, store, sandbox id, backend), ``network_block_all`` for
``none`` and Daytona's allow lists for ``allowlist``, auto-stop, auto-delete and a hard
TTL as the cleanup behind the leases; a lease renewal refreshes the sandbox's activity
(auto-stop counts API calls only).

Agent stdio: a session command started asynchronously, no PTY, running the relay of
``relay.py`` (framed stdin, EOF, signals); the launch header with the environment goes as
a 0600 file uploaded through the file API, never an input call nor the command line.
Output is followed from the logs stream.

Workspace: uploaded into the sandbox at create, brought back (bounded, extracted safely)
by ``destroy`` before the sandbox is deleted; the change capture then runs on the host
as for docker (``sync.py``). Config masks are applied by content there: masked paths are
not uploaded and never taken back. Admission runs again in the sandbox's view, rebuilt
from its file API (``view.py``); ``fs/*``, artifacts and links go through the file API
too (``files.py``, ``remote.py``). The SDK's exceptions are translated in ``api.py``.

Warm slots (``SlotHost``, ``slots.py``): a slot is a sandbox made for no job, its agent
started with no lease; ``assign`` replaces its labels with the attempt's through
Daytona's label call (``PUT /sandbox/{id}/labels``: any reaper then judges it by the
attempt's lease) and arms the relay's watchdog with the attempt's lease; ``fill`` uploads
the staged workspace through the file API as ``create`` does.
"""

from worker.sandbox.daytona.backend import BACKEND_NAME, DaytonaBackend, DaytonaSandbox
from worker.sandbox.daytona.process import DaytonaProcess

__all__ = ["BACKEND_NAME", "DaytonaBackend", "DaytonaProcess", "DaytonaSandbox"]
