"""An interrupted base rootfs build (``worker/images/base.py``): mmdebstrap gets SIGTERM,
so it cleans up what it made in ``$TMPDIR``; a SIGKILL left its folders there."""

from __future__ import annotations

import signal
import tempfile
import threading
import time
from pathlib import Path

import pytest

from worker.images import base

# Stands in for mmdebstrap: makes a folder in $TMPDIR, says where, and removes it on SIGTERM.
TRAPS_TERM = (
    'd=$(mktemp -d); trap \'rmdir "$d"; kill $!; exit 143\' TERM; echo "$d" >"$1";'
    " sleep 60 >/dev/null 2>&1 & wait"
)


def test_an_interrupted_build_stops_mmdebstrap_so_it_cleans_up(tmp_path: Path) -> None:
    said = tmp_path / "made"
    main = threading.main_thread().ident
    assert main is not None

    def interrupt_once_started() -> None:
        deadline = time.monotonic() + 30
        while not (said.exists() and said.read_text().strip()):
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)
        signal.pthread_kill(main, signal.SIGINT)  # as Ctrl-C: wakes the wait it is in

    threading.Thread(target=interrupt_once_started, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        base._run_mmdebstrap(["bash", "-c", TRAPS_TERM, "mmdebstrap", str(said)])
    made = Path(said.read_text().strip())
    assert made.parent == Path(tempfile.gettempdir())
    assert not made.exists()
