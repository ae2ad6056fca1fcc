"""The Kubernetes backend (issue 15): a pod per job attempt, through the official client.

``manifests`` builds the pod of one job attempt, the sandbox namespace's NetworkPolicies
and the namespace-scoped Role and RoleBinding the backend needs, as plain JSON-ready
dicts; ``names`` maps job ids and labels onto what Kubernetes accepts. These two need no
SDK. ``backend`` (``KubernetesBackend``, imported only when the backend is built: it
needs the ``kubernetes`` extra) creates the pod, waits until it runs, copies the
workspace and the state mounts in (``transfer``: tar over exec), execs every program
beside the pod's waiting main process (``stream``: the exec WebSocket as asyncio
streams, the launch header over stdin as the docker backend sends it), copies the
workspace and state back and deletes the pod on ``destroy``, and lists pods by label
(their exact labels from the ``acpw.io/labels`` annotation). Agent config paths are
masked by volumes mounted over the pod's workspace (``manifests.mask_mounts``) and
admission runs again in the pod's own view before launch (``view``). The pod's
``/workspace`` is reached for ``fs/*``, artifacts and prompt links by exec of a small
helper that checks and uses each path in one process (``files``). See
docs/kubernetes.md.
"""
