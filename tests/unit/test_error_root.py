"""One error root: every public exception class of ``worker`` derives from
``WorkerError`` and has a stable ``code`` of its own kind, so a library user catches one
class and branches on ``code`` (as httpx's tree lets one catch ``httpx.HTTPError``)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import pytest

import worker
from worker.errors import WorkerError
from worker.rpc.connection import RpcError
from worker.sandbox.files import PathRefused
from worker.service.ownership import LeaseRefusedError
from worker.store.lease import Refusal

#: Exceptions that never leave the module that raises them, each with the reason.
INTERNAL = {
    # Control flow inside one job: raised and caught within worker/job, never past
    # run_job (a stop becomes the job's outcome).
    "worker.job.outcome.Stopped",
    # OSError kinds of the admission probe, judged by worker/admission/check.py as OS
    # errors and turned into AdmissionRefused there.
    "worker.admission.probe.SymlinkRace",
    "worker.admission.probe.NotRegular",
    "worker.admission.probe.TooLarge",
}
#: Backends' modules whose SDKs are optional extras (imported only when installed).
OPTIONAL = ("worker.sandbox.kubernetes", "worker.sandbox.daytona")


def _exception_classes() -> list[type[BaseException]]:
    found = {}
    for info in pkgutil.walk_packages(worker.__path__, "worker."):
        if info.name.endswith(".__main__"):  # runs the CLI when imported
            continue
        try:
            module = importlib.import_module(info.name)
        except ImportError:
            if info.name.startswith(OPTIONAL):
                continue
            raise
        for _, value in inspect.getmembers(module, inspect.isclass):
            if issubclass(value, BaseException) and value.__module__.startswith("worker"):
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return [found[name] for name in sorted(found)]


def test_every_public_exception_derives_from_worker_error() -> None:
    classes = _exception_classes()
    assert len(classes) > 60, "the walk found too few exception classes to prove anything"
    outside = [
        f"{cls.__module__}.{cls.__qualname__}"
        for cls in classes
        if not issubclass(cls, WorkerError)
        and not cls.__name__.startswith("_")
        and f"{cls.__module__}.{cls.__qualname__}" not in INTERNAL
    ]
    assert outside == []


def test_every_code_is_a_stable_word() -> None:
    for cls in _exception_classes():
        if issubclass(cls, WorkerError):
            assert re.fullmatch(r"[a-z][a-z0-9_]*", cls.code), cls


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (RpcError(-32602, "Invalid params"), "rpc_error"),
        (PathRefused("symlink"), "path_refused"),
        (LeaseRefusedError(Refusal("j", "held", 1, "held by w-1")), "lease_refused"),
    ],
)
def test_the_former_strays_are_caught_as_worker_errors(error: WorkerError, code: str) -> None:
    with pytest.raises(WorkerError) as caught:
        raise error
    assert caught.value.code == code
    assert caught.value.to_dict()["code"] == code
