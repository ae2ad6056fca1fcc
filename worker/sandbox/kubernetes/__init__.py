"""The Kubernetes backend (issue 15), built so far up to its manifests.

``manifests`` builds the pod of one job attempt, the sandbox namespace's NetworkPolicies
and the namespace-scoped Role and RoleBinding the backend needs, as plain JSON-ready
dicts; ``names`` maps job ids and labels onto what Kubernetes accepts. Nothing here
talks to an API server yet, and the backend is not registered (``--backend kubernetes``
is refused): see docs/kubernetes.md.
"""
