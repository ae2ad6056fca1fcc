"""The relay a Daytona session command runs: the agent's stdin arrives as framed input
calls, and only the relay can turn a frame into an EOF or a signal.

Daytona's session API writes each input call to the command's stdin and has no call that
closes it (nor a PTY-free way to signal the command), while a CLI agent waits for EOF
(it hangs with stdin open). So the command is this relay,
``python3 -I -S -c RELAY HEADER_PATH``:

1. it reads the launch header from ``HEADER_PATH`` — a 0600 file in a 0700 directory the
   worker uploaded through the file API, JSON: argv, cwd, the complete environment, the
   config masks, the lease's remaining seconds — and removes the file and its directory
   before anything else. The environment, and so every credential, never travels as an
   input call (a runner that ignores ``suppressInputEcho`` would echo it into the
   command's log) nor on the command line Daytona records;
2. it makes the masks' mount points that are missing (empty directories and files) and
   forks the program in a session of its own with a pipe as its stdin (stdout and stderr
   are the command's own, which Daytona's log stream carries). With masks, the child
   first enters a user and mount namespace of its own, binds each anchor onto itself and
   each masked file or directory read-only onto itself, and enters a second user
   namespace (mapped back to its own uid) so those mounts are locked: the agent can
   neither write at a masked path nor unmount or remount it. A child that cannot do so
   exits 126 before the program runs (the masks are never silently skipped);
3. it reads frames: ``D`` + ``%010d`` sequence number + ``%010d`` length + that many bytes
   (written to the program's stdin, unless the sequence number is not above the last
   one applied: a retried input call that the daemon had already applied is dropped),
   ``E`` (closes it: the program's EOF), ``T``/``K`` (SIGTERM/SIGKILL to the program's
   process group), ``L`` + ``%010d`` milliseconds (the lease was renewed: it now ends that
   long from now). Any other byte between frames (a newline a daemon may add to an input)
   is skipped. The worker ends every frame with a newline: a runner that ignores
   ``suppressInputEcho`` echoes each input call into the command's log, which is the
   agent's stdout as the worker reads it, and an echoed frame must be a line of its own
   (skipped as not JSON-RPC), never the head of the agent's next line (an ``L`` frame
   echoed just before the agent's answer to ``initialize`` made that answer unreadable,
   and the job waited for it until its time-out);
4. when the header gave a lease (or, for a warm slot's agent started with none, once
   its first ``L`` frame arrives: the claiming attempt's lease) and the last renewal's
   time passes unrenewed (the worker is frozen or gone), a watchdog thread (it looks
   every 0.1 s) SIGKILLs every descendant of the relay until none is left — the relay
   is their child subreaper, so a process that left the program's session or was
   orphaned is still one — and the relay exits 137: the sandbox's work dies with the
   lease whatever state the worker is in;
5. it removes the mount points it made (when still empty) and exits with the program's
   status (128 + N when signal N ended it).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence

RELAY = (
    "import os,sys,json,signal,threading,time\n"
    "def rd(n):\n"
    " b=b''\n"
    " while len(b)<n:\n"
    "  c=os.read(0,n-len(b))\n"
    "  if not c: return None\n"
    "  b+=c\n"
    " return b\n"
    "def num():\n"
    " n=rd(10)\n"
    " return int(n) if n is not None and n.isdigit() else None\n"
    "hp=sys.argv[1]\n"
    "try:\n"
    " with open(hp,'rb') as f: m=json.loads(f.read())\n"
    "except (OSError,ValueError) as e:\n"
    " sys.stderr.write('acpw: cannot read the launch header: %s\\n'%e);os._exit(125)\n"
    "for p in (hp,os.path.dirname(hp)):\n"
    " try: os.rmdir(p) if p!=hp else os.unlink(p)\n"
    " except OSError: pass\n"
    "ms=m.get('masks') or []\n"
    "made=[]\n"
    "for k,p in ms:\n"
    " try:\n"
    "  if k=='file': os.close(os.open(p,os.O_WRONLY|os.O_CREAT|os.O_EXCL|os.O_NOFOLLOW,0o644))\n"
    "  else: os.mkdir(p,0o755)\n"
    "  made.append((k,p))\n"
    " except FileExistsError: pass\n"
    " except OSError as e:\n"
    "  sys.stderr.write('acpw: cannot make the mask point %s: %s\\n'%(p,e));os._exit(126)\n"
    "def mask():\n"
    " import ctypes\n"
    " c=ctypes.CDLL(None,use_errno=True)\n"
    " u,g=os.getuid(),os.getgid()\n"
    " def fail(what):\n"
    "  e=ctypes.get_errno();raise OSError(e,'%s: %s'%(what,os.strerror(e)))\n"
    " def ns(a,b,x,y):\n"
    "  if c.unshare(0x10020000)!=0: fail('unshare')\n"
    "  for f,v in (('setgroups','deny'),('uid_map','%d %d 1'%(a,b)),('gid_map','%d %d 1'%(x,y))):\n"
    "   with open('/proc/self/'+f,'w') as o: o.write(v)\n"
    " def mt(s,d,fl):\n"
    "  if c.mount(s,d,None,fl,None)!=0: fail('mount %s'%d.decode())\n"
    " ns(0,u,0,g)\n"
    " mt(None,b'/',0x44000)\n"
    " for k,p in ms:\n"
    "  b=p.encode();mt(b,b,4096)\n"
    "  if k!='anchor': mt(None,b,4096|32|1|2|4)\n"
    " ns(u,0,g,0)\n"
    "try:\n"
    " import ctypes;ctypes.CDLL(None).prctl(36,1,0,0,0)\n"
    "except Exception: pass\n"
    "r,w=os.pipe()\n"
    "pid=os.fork()\n"
    "if pid==0:\n"
    " os.setsid();os.dup2(r,0);os.close(r);os.close(w)\n"
    " if ms:\n"
    "  try: mask()\n"
    "  except OSError as e:\n"
    "   sys.stderr.write('acpw: cannot make the config masks read-only: %s\\n'%e);os._exit(126)\n"
    " try:\n"
    "  os.chdir(m['cwd']);os.execvpe(m['argv'][0],m['argv'],m['env'])\n"
    " except OSError as e:\n"
    "  sys.stderr.write('acpw: cannot exec %s: %s\\n'%(m['argv'][0],e));os._exit(127)\n"
    "os.close(r)\n"
    "lease=m.get('lease_s')\n"
    "dl=[None if lease is None else time.monotonic()+float(lease)]\n"
    "def sig(t):\n"
    " try: os.killpg(pid,signal.SIGTERM if t==b'T' else signal.SIGKILL)\n"
    " except OSError: pass\n"
    "def ctl(t):\n"
    " if t in (b'T',b'K'): sig(t)\n"
    " if t==b'L':\n"
    "  n=num()\n"
    "  if n is None: return\n"
    "  armed=dl[0] is not None\n"
    "  dl[0]=time.monotonic()+n/1000.0\n"
    "  if not armed: threading.Thread(target=dog,daemon=True).start()\n"
    "def dog():\n"
    " while True:\n"
    "  time.sleep(0.1)\n"
    "  if dl[0] is not None and time.monotonic()>dl[0]: break\n"
    " sys.stderr.write('acpw: the lease lapsed unrenewed: the agent is killed\\n')\n"
    " sys.stderr.flush()\n"
    " for _ in range(200):\n"
    "  left=tree()\n"
    "  if not left: break\n"
    "  for p in left:\n"
    "   try: os.kill(p,signal.SIGKILL)\n"
    "   except OSError: pass\n"
    "  try:\n"
    "   while os.waitpid(-1,os.WNOHANG)[0]: pass\n"
    "  except OSError: pass\n"
    "  time.sleep(0.01)\n"
    " os._exit(137)\n"
    "def tree():\n"
    " kids={}\n"
    " for d in os.listdir('/proc'):\n"
    "  if not d.isdigit(): continue\n"
    "  try:\n"
    "   with open('/proc/%s/stat'%d) as f: st,pp=f.read().rsplit(')',1)[1].split()[:2]\n"
    "  except (OSError,ValueError): continue\n"
    "  if st!='Z': kids.setdefault(int(pp),[]).append(int(d))\n"
    " out=[];todo=[os.getpid()]\n"
    " while todo:\n"
    "  for k in kids.get(todo.pop(),[]): out.append(k);todo.append(k)\n"
    " return out\n"
    "def feed():\n"
    " last=0\n"
    " while True:\n"
    "  t=rd(1)\n"
    "  if t is None or t==b'E': break\n"
    "  ctl(t)\n"
    "  if t!=b'D': continue\n"
    "  s=num();n=num()\n"
    "  d=rd(n) if n is not None else None\n"
    "  if s is None or d is None: break\n"
    "  if s<=last: continue\n"
    "  last=s\n"
    "  try:\n"
    "   while d: d=d[os.write(w,d):]\n"
    "  except OSError: pass\n"
    " os.close(w)\n"
    " while True:\n"
    "  t=rd(1)\n"
    "  if t is None: return\n"
    "  ctl(t)\n"
    "threading.Thread(target=feed,daemon=True).start()\n"
    "if dl[0] is not None: threading.Thread(target=dog,daemon=True).start()\n"
    "try: st=os.waitpid(pid,0)[1]\n"
    "except ChildProcessError: time.sleep(10);os._exit(137)\n"
    "for k,p in reversed(made):\n"
    " try: os.rmdir(p) if k!='file' else (os.path.getsize(p)==0 and os.unlink(p))\n"
    " except OSError: pass\n"
    "os._exit(128+os.WTERMSIG(st) if os.WIFSIGNALED(st) else os.WEXITSTATUS(st))\n"
)

EOF_FRAME = "E\n"
TERM_FRAME = "T\n"
KILL_FRAME = "K\n"


def relay_command(header_path: str, python: str = "python3") -> str:
    """The session command that runs the relay on the header at ``header_path`` (no
    credential in it)."""
    return shlex.join([python, "-I", "-S", "-c", RELAY, header_path])


def launch_header(
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: str,
    *,
    masks: Sequence[tuple[str, str]] = (),
    lease_s: float | None = None,
) -> bytes:
    """The header file the relay reads before it forks the program: ``masks`` are
    (``anchor``/``file``/``dir``, absolute path in the sandbox) in mount order,
    ``lease_s`` the seconds the lease has left (``None``: no lease, no watchdog until an
    ``L`` frame arms it)."""
    body = {
        "argv": list(argv),
        "env": dict(env),
        "cwd": cwd,
        "masks": [list(m) for m in masks],
        "lease_s": lease_s,
    }
    return json.dumps(body).encode()


def data_frame(seq: int, payload: str) -> str:
    """``D`` frame number ``seq`` (from 1, increasing) carrying ``payload`` (its length in
    UTF-8 bytes), then the newline that ends every frame (module docstring, 3)."""
    return f"D{seq:010d}{len(payload.encode()):010d}{payload}\n"


def lease_frame(remaining_s: float) -> str:
    """``L``: the lease now ends ``remaining_s`` from when the relay reads this (newline
    ended, as every frame)."""
    return f"L{max(0, min(int(remaining_s * 1000), 9_999_999_999)):010d}\n"
