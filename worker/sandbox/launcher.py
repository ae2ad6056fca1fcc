"""Starting a program in a container with exactly its argv, env and cwd, for the
backends that start programs through a container service (docker, kubernetes).

Nothing of a job goes into the container's configuration: the launcher (``python3 -I -S
-c``) reads a header from stdin byte-exactly — ``<10-digit length><JSON {argv, env,
cwd}>`` (``launch_header``) — leaving the rest of stdin to the program, then execs
``argv`` with exactly ``env``. Exit 125: the header was cut short; 127: the program could
not be exec'd.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Mapping, Sequence

_READ_HEADER = (
    "import os,json,sys\n"
    "def rd(n):\n"
    " b=b''\n"
    " while len(b)<n:\n"
    "  c=os.read(0,n-len(b))\n"
    "  if not c: os._exit(125)\n"
    "  b+=c\n"
    " return b\n"
    "m=json.loads(rd(int(rd(10))))\n"
)
#: Leads its own process group (a new session; where exec made it a session leader
#: already, as Podman's does, both setsid and setpgid are refused and its group is its
#: own) and writes that group's id as 10 digits on stdout, for signals sent to the group.
_LEAD_GROUP = (
    "try: os.setsid()\n"
    "except OSError:\n"
    " try: os.setpgid(0,0)\n"
    " except OSError: pass\n"
    "os.write(1,b'%010d'%os.getpgrp())\n"
)
_EXEC = (
    "os.chdir(m['cwd'])\n"
    "try: os.execvpe(m['argv'][0],m['argv'],m['env'])\n"
    "except OSError as e:\n"
    " sys.stderr.write('acpw: cannot exec %s: %s\\n'%(m['argv'][0],e)); os._exit(127)\n"
)


def launcher_argv(*, lead_group: bool = False) -> list[str]:
    """The launcher's command line; ``lead_group``: it first leads a process group of
    its own and says its id (10 digits on stdout) before the program's output."""
    source = _READ_HEADER + (_LEAD_GROUP if lead_group else "") + _EXEC
    return ["/usr/bin/python3", "-I", "-S", "-c", source]


def launch_header(argv: Sequence[str], env: Mapping[str, str], cwd: str) -> bytes:
    """What the launcher reads from stdin before exec."""
    body = json.dumps({"argv": list(argv), "env": dict(env), "cwd": cwd}).encode()
    return b"%010d" % len(body) + body


def exit_status(status: int) -> int:
    """A container's or exec's exit status as asyncio reports a process's: 128+N → -N
    (signal N)."""
    if 128 < status < 128 + signal.NSIG:
        return -(status - 128)
    return status
