"""The relay a Daytona session command runs: the agent's stdin arrives as framed input
calls, and only the relay can turn a frame into an EOF or a signal.

Daytona's session API writes each input call to the command's stdin and has no call that
closes it (nor a PTY-free way to signal the command), while a CLI agent waits for EOF
(it hangs with stdin open). So the command is this relay, ``python3 -I -S -c RELAY``:

1. it reads the launch header (``%010d`` length + JSON: argv, cwd, the complete
   environment), byte-exact, as the docker backend's launcher does: the environment, and
   so every credential, never enters the command line Daytona records;
2. it forks the program in a session of its own with a pipe as its stdin (stdout and
   stderr are the command's own, which Daytona's log stream carries);
3. it reads frames: ``D`` + ``%010d`` length + that many bytes (written to the program's
   stdin), ``E`` (closes it: the program's EOF), ``T``/``K`` (SIGTERM/SIGKILL to the
   program's process group). Any other byte between frames (a newline a daemon may add
   to an input) is skipped;
4. it exits with the program's status (128 + N when signal N ended it).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence

RELAY = (
    "import os,sys,json,signal,threading\n"
    "def rd(n):\n"
    " b=b''\n"
    " while len(b)<n:\n"
    "  c=os.read(0,n-len(b))\n"
    "  if not c: return None\n"
    "  b+=c\n"
    " return b\n"
    "h=rd(10)\n"
    "if h is None: os._exit(125)\n"
    "m=json.loads(rd(int(h)))\n"
    "r,w=os.pipe()\n"
    "pid=os.fork()\n"
    "if pid==0:\n"
    " os.setsid();os.dup2(r,0);os.close(r);os.close(w)\n"
    " try:\n"
    "  os.chdir(m['cwd']);os.execvpe(m['argv'][0],m['argv'],m['env'])\n"
    " except OSError as e:\n"
    "  sys.stderr.write('acpw: cannot exec %s: %s\\n'%(m['argv'][0],e));os._exit(127)\n"
    "os.close(r)\n"
    "def sig(t):\n"
    " try: os.killpg(pid,signal.SIGTERM if t==b'T' else signal.SIGKILL)\n"
    " except OSError: pass\n"
    "def feed():\n"
    " while True:\n"
    "  t=rd(1)\n"
    "  if t is None or t==b'E': break\n"
    "  if t in (b'T',b'K'): sig(t)\n"
    "  if t!=b'D': continue\n"
    "  n=rd(10);d=rd(int(n)) if n else None\n"
    "  if d is None: break\n"
    "  try:\n"
    "   while d: d=d[os.write(w,d):]\n"
    "  except OSError: pass\n"
    " os.close(w)\n"
    " while True:\n"
    "  t=rd(1)\n"
    "  if t is None: return\n"
    "  if t in (b'T',b'K'): sig(t)\n"
    "threading.Thread(target=feed,daemon=True).start()\n"
    "st=os.waitpid(pid,0)[1]\n"
    "os._exit(128+os.WTERMSIG(st) if os.WIFSIGNALED(st) else os.WEXITSTATUS(st))\n"
)

EOF_FRAME = "E"
TERM_FRAME = "T"
KILL_FRAME = "K"


def relay_command(python: str = "python3") -> str:
    """The session command that runs the relay (no credential in it)."""
    return shlex.join([python, "-I", "-S", "-c", RELAY])


def launch_header(argv: Sequence[str], env: Mapping[str, str], cwd: str) -> str:
    """What the relay reads before it forks the program."""
    body = json.dumps({"argv": list(argv), "env": dict(env), "cwd": cwd})
    return f"{len(body.encode()):010d}{body}"


def data_frame(payload: str) -> str:
    """One ``D`` frame carrying ``payload`` (its length in UTF-8 bytes)."""
    return f"D{len(payload.encode()):010d}{payload}"
