"""File helpers shared by the packs modules: JSON in, atomic JSON out, error mapping."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from worker.errors import InvalidInput


def read_json(path: Path) -> Any:
    """Parse *path* as JSON; raises InvalidInput when it is unreadable or malformed."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"cannot read {path}: {exc}", path=str(path)) from exc
    except json.JSONDecodeError as exc:
        raise InvalidInput(
            f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})",
            path=str(path),
            field="(json)",
        ) from exc


def write_json(path: Path, data: object) -> None:
    """Write *data* to *path* atomically (temp file in the same folder, then rename)."""
    text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def invalid_input(exc: ValidationError, *, path: Path | str) -> InvalidInput:
    """The first pydantic error as an InvalidInput naming the field."""
    first = exc.errors()[0]
    field = ".".join(str(part) for part in first["loc"]) or "(root)"
    return InvalidInput(
        f"{path}: field {field!r}: {first['msg']}",
        path=str(path),
        field=field,
        errors=exc.error_count(),
    )
