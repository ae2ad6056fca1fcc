"""A local double of the part of Daytona's HTTP API that the daytona backend uses.

Daytona's hosted service cannot run on these machines (no network but the package
registries, and its control plane and runners are not something one installs in a test),
so the backend's tests run the real ``daytona`` SDK against this double instead. It is a
real HTTP server (aiohttp, on a loopback port the tests pick) that answers:

- the main API: snapshots (create, get by id or name, list), sandboxes (create from a
  snapshot with labels, ``networkBlockAll`` / allow lists, auto-stop, auto-delete and TTL;
  get by id or name, list by labels, replace labels, start, stop, delete, last activity,
  toolbox proxy URL);
- the toolbox API below ``/toolbox/<sandbox id>``: process sessions (create, execute a
  command synchronously or asynchronously, send input to its stdin, its status and exit
  code, its logs as a websocket stream framed as the daemon frames them, delete), and
  file upload and download (``files/bulk-upload``, ``files/bulk-download``, multipart as
  the daemon speaks it), file info (``files/info``: the entry itself, ``lstat``, its mode
  in Go's ``os.FileMode`` notation) and folder creation (``files/folder``). Reads see the
  sandbox's view (``/usr``, ``/etc``, ``/opt/acp-pack`` too); writes only its own trees.

Every request body and every response is validated with the SDK's own generated models
(``daytona_api_client`` / ``daytona_toolbox_api_client``), so a request the real API
would refuse for its shape is refused here too (400), and an answer the SDK could not read
fails the test. Authentication is a bearer key; a wrong one gets 401 as from Daytona.

A sandbox is a directory on the host; its commands run as real processes under
bubblewrap with that directory's ``workspace``, ``home`` and ``tmp`` bound at
``/workspace``, ``/home`` and ``/tmp`` and the snapshot's pack closure read-only at
``/opt/acp-pack`` over the host's ``/usr`` (the double's "registry" maps an image
reference to the closure that image would hold). ``networkBlockAll`` unshares the
network namespace. Nothing of Daytona's scheduling, billing or isolation is modelled.

Faults for the error paths are injected per route (:meth:`DaytonaDouble.fail_next`):
429 with ``Retry-After``, 403 quota, 401, and an error answered *after* the request was
served (``after=True``: a gateway that lost the answer of an applied call). Modes the
real service has (docs/daytona.md lists each with its public source): ``echo_input``
(every input call echoed into the command's log, a runner that ignores
``suppressInputEcho``), ``rtt_s`` (a round-trip time waited per request and per log
message), snapshot build timings (``snapshot_build_s``: pending, building, then active or
``build_failed``; ``fail_builds``; ``stuck_images``; activate and delete), sandbox start
timing (``sandbox_start_s``), private
registries whose pulls need registered credentials (``private_registries``), an
organisation CPU limit answered as Daytona words it (``org_cpu_limit``), and counters
(``in_flight``/``most_in_flight``, ``timed``, ``snapshot_calls``, ``header_modes``).
"""

from tests.daytona_double.server import DaytonaDouble

__all__ = ["DaytonaDouble"]
