"""The docs cannot drift from the code: each test reads a page and the code it describes.

- docs/architecture.md's layer block is the import-linter layers contract, and that
  contract is tight (every package sits directly on something it imports);
- every backend of the registry is named where the page says how to add one;
- every ``ACPW_*`` setting is in docs/contracts.md (a backend's own settings may be a
  ``ACPW_<PREFIX>_*`` row there that points to the backend's page, which names them);
- every ``make`` target and ``acp-worker`` sub-command the README shows exists;
- user-facing docs name no issue numbers (their readers have no tracker).
"""

from __future__ import annotations

import itertools
import re
import tomllib
from pathlib import Path

import grimp
import pytest

from worker.cli import _build_parser
from worker.sandbox.registry import REGISTRY
from worker.settings import Settings

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
ARCHITECTURE = DOCS / "architecture.md"
#: Pages a user of the product reads (everything but the tests' own notes).
USER_DOCS = [
    REPO / "README.md",
    *sorted(DOCS.glob("*.md")),
    *sorted(REPO.glob("provider_packs/*/README.md")),
    *sorted(REPO.glob("helm/*/README.md")),
]


def _contract_layers() -> list[set[str]]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    layers = next(c["layers"] for c in contracts if c["type"] == "layers")
    return [{name.strip() for name in layer.split("|")} for layer in layers]


def _doc_layers() -> list[set[str]]:
    """The packages of each line of the layer block (below its rule: ``tasks/`` is not in
    ``worker/``), names before the first run of three spaces: ``job/  metrics.py``."""
    text = ARCHITECTURE.read_text()
    section = text.split("## Layers", 1)[1].split("```", 2)[1]
    below_rule = section.split("─" * 20, 1)[1].split("\n", 1)[1]
    layers = []
    for line in below_rule.splitlines():
        if not line.strip() or line.startswith("  "):  # a description's continuation
            continue
        head = re.split(r" {3,}", line.strip(), maxsplit=1)[0]
        layers.append({re.sub(r"(/|\.py)$", "", name) for name in head.split()})
    return layers


def test_the_architecture_pages_layer_block_is_the_import_contract() -> None:
    assert _doc_layers() == _contract_layers(), (
        "docs/architecture.md's layer block and pyproject.toml's layers contract differ"
    )


def test_every_package_of_worker_is_in_one_layer() -> None:
    named = [name for layer in _contract_layers() for name in layer]
    packages = {p.stem for p in (REPO / "worker").iterdir() if _is_module(p)}
    assert sorted(named) == sorted(packages)


def _is_module(path: Path) -> bool:
    if path.name.startswith("_"):
        return False
    return (path.is_dir() and (path / "__init__.py").exists()) or path.suffix == ".py"


def test_the_layers_are_as_tight_as_the_imports() -> None:
    """No layer could move down: each package above the bottom imports (directly) one on
    the layer right below it, so siblings that are independent share a layer and the
    contract says what the architecture is, not one accident of it."""
    graph = grimp.build_graph("worker")
    layers = _contract_layers()[::-1]  # bottom first
    loose = [
        f"{name} imports nothing of {' | '.join(sorted(below))}"
        for below, layer in itertools.pairwise(layers)
        for name in sorted(layer)
        if not any(
            graph.direct_import_exists(
                importer=f"worker.{name}", imported=f"worker.{low}", as_packages=True
            )
            for low in below
        )
    ]
    assert loose == []


def test_every_registered_backend_is_on_the_add_a_backend_page() -> None:
    text = ARCHITECTURE.read_text()
    section = text.split("### How to add a backend", 1)[1].split("\n## ", 1)[0]
    today = text.split("### The backends today", 1)[1].split("\n### ", 1)[0]
    for name in REGISTRY:
        assert f"`{name}`" in section, f"the add-a-backend steps never name `{name}`"
        assert f"- `{name}`" in today, f"'The backends today' has no entry for `{name}`"


def test_the_import_contract_keeps_every_registered_backend_private() -> None:
    """Adding a backend to the registry without forbidding its package to the rest of the
    tree fails here, naming the module to add to the contract."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    contract = next(
        c for c in config["tool"]["importlinter"]["contracts"] if c["name"].startswith("Only")
    )
    packages = {entry.backend.split(":")[0] for entry in REGISTRY.values()}
    # A backend's own package: its module, or the package a module inside it belongs to.
    own = {m if m.count(".") == 2 else m.rsplit(".", 1)[0] for m in packages}
    assert sorted(own) == sorted(contract["forbidden_modules"])


def _settings_variables() -> dict[str, type]:
    """Every ``ACPW_*`` variable a settings class reads, with its class."""
    found: dict[str, type] = {}
    for cls in [Settings, *(entry.config for entry in REGISTRY.values())]:
        prefix = str(cls.model_config.get("env_prefix", ""))
        for name, field in cls.model_fields.items():
            if name == "type":  # the discriminator, not a setting
                continue
            alias = field.validation_alias
            found[(prefix + (alias if isinstance(alias, str) else name)).upper()] = cls
    return found


def _wildcard_rows(contracts: str) -> list[tuple[str, str]]:
    """(prefix, page) of each settings row ``| `ACPW_<PREFIX>_*` | … [page](page.md…``."""
    return re.findall(
        r"^\| `(ACPW_[A-Z0-9_]+_)\*` \|[^\n]*?\]\(([a-z-]+\.md)", contracts, re.MULTILINE
    )


def test_every_setting_is_in_the_contracts_page() -> None:
    contracts = (DOCS / "contracts.md").read_text()
    wildcards = _wildcard_rows(contracts)
    missing = []
    for variable in sorted(_settings_variables()):
        if re.search(rf"\b{variable}\b", contracts):
            continue
        pages = [page for prefix, page in wildcards if variable.startswith(prefix)]
        if any(re.search(rf"\b{variable}\b", (DOCS / page).read_text()) for page in pages):
            continue
        missing.append(variable)
    assert missing == [], "settings missing from docs/contracts.md (or their backend's page)"


def test_the_wildcard_rows_point_to_pages_that_exist() -> None:
    contracts = (DOCS / "contracts.md").read_text()
    rows = _wildcard_rows(contracts)
    assert rows, "the contracts page lost its backend settings rows"
    for _, page in rows:
        assert (DOCS / page).exists()


def _make_targets() -> set[str]:
    makefile = (REPO / "Makefile").read_text()
    return set(re.findall(r"^([a-z][a-z0-9-]*):", makefile, flags=re.MULTILINE))


def _cli_commands() -> set[str]:
    parser = _build_parser(["--help"])
    sub = next(a for a in parser._actions if a.dest == "command")
    return set(sub.choices or {})


def _readme_code() -> list[str]:
    """What the README shows as code: fenced blocks and inline spans."""
    text = (REPO / "README.md").read_text()
    blocks = re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.DOTALL)
    inline = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.DOTALL))
    return blocks + inline


def test_every_command_the_readme_shows_exists() -> None:
    targets, commands = _make_targets(), _cli_commands()
    shown_make, shown_cli = set(), set()
    for code in _readme_code():
        shown_make.update(re.findall(r"(?:^|[\s;&|(])make ([a-z][a-z0-9-]*)", code))
        shown_cli.update(re.findall(r"acp-worker ([a-z][a-z-]*)", code))
    assert shown_make, "the README shows no make target: the check reads nothing"
    assert shown_cli, "the README shows no acp-worker command: the check reads nothing"
    assert sorted(shown_make - targets) == []
    assert sorted(shown_cli - commands) == []


def test_the_readme_is_first_contact_not_the_manual() -> None:
    """Detail belongs in docs/: the README stays short enough to read at once."""
    assert len((REPO / "README.md").read_bytes()) <= 12_000  # bytes: a non-ASCII sign counts 2-3


@pytest.mark.parametrize("page", USER_DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_user_facing_docs_name_no_issue_numbers(page: Path) -> None:
    found = re.findall(r"\b[Ii]ssues? #?\d+\b", page.read_text())
    assert found == [], f"{page.relative_to(REPO)} refers to the tracker: {found}"
