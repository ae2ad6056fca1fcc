"""The cursor launch contract (``worker.packs.contract``): every flag that widens what the
agent may do is refused in every spelling, the private environment is required, and the
repository's two cursor packs (the emulator and the real recipe) pass it."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.errors import LaunchRefused, PackUnlocked
from worker.launch import expand
from worker.packs.contract import check_declared, check_launch, program
from worker.packs.manifest import load_pack, parse_manifest

PACKS = Path(__file__).resolve().parents[2] / "provider_packs"
HOME = expand("{home}")
PROGRAM = ["/opt/acp-pack/dist-package/node", "/opt/acp-pack/dist-package/index.js"]
OPTIONS = ["--disable-project-configs", "--disable-auto-update"]
GOOD_ENV = {
    "CURSOR_CONFIG_DIR": f"{HOME}/.cursor",
    "CURSOR_DATA_DIR": f"{HOME}/.cursor-data",
    "AGENT_CLI_CREDENTIAL_STORE": "memory",
    "NO_OPEN_BROWSER": "1",
    "NODE_DISABLE_COMPILE_CACHE": "1",
}


def _refusal(argv: list[str], env: dict[str, str] | None = None, **kw: object) -> LaunchRefused:
    with pytest.raises(LaunchRefused) as caught:
        check_launch("cursor", argv, GOOD_ENV if env is None else env, home=HOME, pack="p",
                     **kw)  # type: ignore[arg-type]  # fmt: skip
    return caught.value


def test_the_contract_argv_and_environment_pass() -> None:
    check_launch("cursor", [*PROGRAM, *OPTIONS, "acp"], GOOD_ENV, home=HOME, pack="p")
    check_launch("cursor", [*PROGRAM, "--sandbox", "enabled", *OPTIONS, "acp"], GOOD_ENV,
                 home=HOME, pack="p")  # fmt: skip
    check_launch("cursor", [*PROGRAM, "--sandbox=enabled", *OPTIONS, "acp"], GOOD_ENV,
                 home=HOME, pack="p")  # fmt: skip


@pytest.mark.parametrize(
    ("added", "flag"),
    [
        (["--force"], "--force"),
        (["--force=true"], "--force=true"),
        (["-f"], "-f"),
        (["-pf"], "-pf"),  # combined short flags
        (["-fp"], "-fp"),
        (["--yolo"], "--yolo"),
        (["--yolo=1"], "--yolo=1"),
        (["--trust"], "--trust"),
        (["--approve-mcps"], "--approve-mcps"),
        (["--sandbox", "disabled"], "--sandbox disabled"),
        (["--sandbox=disabled"], "--sandbox=disabled"),
        (["--sandbox"], "--sandbox"),
        (["-e", "https://api2.example.com"], "-e"),
        (["-ehttps://api2.example.com"], "-ehttps://api2.example.com"),
        (["--endpoint", "https://api2.example.com"], "--endpoint"),
        (["--endpoint=https://api2.example.com"], "--endpoint=https://api2.example.com"),
        (["-H", "X-Team: a"], "-H"),
        (["--header=X-Team: a"], "--header=X-Team: a"),
        (["--api-key", "k"], "--api-key"),
        (["--auth-token=t"], "--auth-token=t"),
        (["--data-dir", "/tmp/d"], "--data-dir"),
        (["--worktree"], "--worktree"),  # not in the contract at all
    ],
)
def test_each_refused_flag_before_acp_is_named(added: list[str], flag: str) -> None:
    error = _refusal([*PROGRAM, *added, *OPTIONS, "acp"])
    assert (error.code, error.exit_code) == ("launch_refused", 3)
    assert error.details["flag"] == flag
    assert flag in error.message
    assert error.details["dialect"] == "cursor"


@pytest.mark.parametrize("flag", ["--force", "-f", "--yolo", "--trust", "--approve-mcps"])
def test_a_refused_flag_after_acp_is_named_too(flag: str) -> None:
    error = _refusal([*PROGRAM, *OPTIONS, "acp", flag])
    assert error.details["flag"] == flag
    assert "permission" in error.details["reason"] or "without" in error.details["reason"]


def test_anything_after_acp_is_refused() -> None:
    error = _refusal([*PROGRAM, *OPTIONS, "acp", "--sandbox", "enabled"])
    assert error.details["flag"] == "--sandbox"
    assert "follow `acp`" in error.details["reason"]


@pytest.mark.parametrize("missing", OPTIONS)
def test_the_fixed_options_are_required(missing: str) -> None:
    options = [o for o in OPTIONS if o != missing]
    assert _refusal([*PROGRAM, *options, "acp"]).details["flag"] == missing


@pytest.mark.parametrize(
    "argv",
    [[*PROGRAM, *OPTIONS], [*PROGRAM, *OPTIONS, "acp", "acp"], ["--force", "acp"]],
    ids=["no-acp", "acp-twice", "no-program"],
)
def test_the_shape_is_program_options_acp(argv: list[str]) -> None:
    assert _refusal(argv).details["flag"] in {"acp", "--force"}


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("AGENT_CLI_CREDENTIAL_STORE", "file"),
        ("AGENT_CLI_CREDENTIAL_STORE", None),
        ("NO_OPEN_BROWSER", "0"),
        ("NO_OPEN_BROWSER", None),
        ("NODE_DISABLE_COMPILE_CACHE", None),
        ("CURSOR_CONFIG_DIR", "/etc/cursor"),
        ("CURSOR_CONFIG_DIR", f"{HOME}/../etc"),
        ("CURSOR_CONFIG_DIR", HOME),
        ("CURSOR_DATA_DIR", "/var/lib/cursor"),
        ("CURSOR_DATA_DIR", None),
    ],
)
def test_the_private_environment_is_required(variable: str, value: str | None) -> None:
    env = {k: v for k, v in GOOD_ENV.items() if k != variable}
    if value is not None:
        env[variable] = value
    error = _refusal([*PROGRAM, *OPTIONS, "acp"], env)
    assert error.details["variable"] == variable


@pytest.mark.parametrize(
    ("fixed", "variable"),
    [
        ({"CURSOR_API_KEY": "k"}, "CURSOR_API_KEY"),
        ({"CURSOR_AUTH_TOKEN": "t"}, "CURSOR_AUTH_TOKEN"),
        ({"SOME_BASE": "https://api.example.com"}, "SOME_BASE"),
    ],
)
def test_the_packs_own_variables_hold_no_credential_and_no_endpoint(
    fixed: dict[str, str], variable: str
) -> None:
    env = {**GOOD_ENV, **fixed}
    error = _refusal([*PROGRAM, *OPTIONS, "acp"], env, fixed_env=fixed)
    assert error.details["variable"] == variable


def test_a_bound_credential_is_not_the_packs_own() -> None:
    env = {**GOOD_ENV, "CURSOR_API_KEY": "bound-by-the-job"}
    check_launch("cursor", [*PROGRAM, *OPTIONS, "acp"], env, home=HOME, pack="p", fixed_env={})


def test_other_dialects_have_no_contract() -> None:
    check_launch("acp", ["/usr/bin/node", "x.js", "--yolo"], {}, home=HOME, pack="p")


def test_program_is_the_words_before_the_first_option() -> None:
    assert program([*PROGRAM, *OPTIONS, "acp"]) == tuple(PROGRAM)
    assert program(["/usr/bin/python3", "e.py", "acp"]) == ("/usr/bin/python3", "e.py")


@pytest.mark.parametrize("name", ["cursor", "cursor-emulator"])
def test_the_repositorys_cursor_packs_keep_the_contract(name: str) -> None:
    check_declared(load_pack(PACKS, name).manifest)


def test_a_yolo_copy_of_the_recipe_is_refused() -> None:
    data = load_pack(PACKS, "cursor").manifest.model_dump(by_alias=True)
    data["launch"]["argv"].insert(2, "--yolo")
    with pytest.raises(LaunchRefused, match="--yolo"):
        check_declared(parse_manifest(data, path="pack.json"))


def test_the_cursor_recipe_is_unlocked_and_says_how_to_lock_it() -> None:
    pack = load_pack(PACKS, "cursor")
    assert pack.unlocked
    with pytest.raises(PackUnlocked) as caught:
        pack.for_platform("linux-x64")
    error = caught.value
    assert (error.code, error.exit_code) == ("pack_unlocked", 3)
    url = pack.manifest.download["linux-x64"].url  # type: ignore[index]
    assert url.startswith("https://")
    command = f"acp-worker pack lock cursor --url {url} --platform linux-x64"
    assert error.details["command"] == command
    assert command in error.message


def test_an_unlocked_pack_without_a_download_names_a_placeholder() -> None:
    data = load_pack(PACKS, "cursor").manifest.model_dump(by_alias=True, exclude={"download"})
    pack = load_pack(PACKS, "cursor")
    bare = type(pack)(parse_manifest(data, path="pack.json"), pack.path)
    with pytest.raises(PackUnlocked, match="--url <https-url>"):
        bare.refuse_unlocked("linux-x64")


def test_a_locked_pack_is_not_unlocked() -> None:
    pack = load_pack(PACKS, "cursor-emulator")
    assert not pack.unlocked
    pack.refuse_unlocked()
