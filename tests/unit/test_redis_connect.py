"""The one Redis connection factory (worker/store/connect.py): how a URL and the settings
become redis-py's and Celery's arguments, and how a URL is printed."""

from __future__ import annotations

import logging
import ssl
from pathlib import Path

import pytest

from worker.client.queue import celery_config
from worker.errors import CredentialRefused, InvalidInput
from worker.settings import Settings
from worker.store import connect


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:s3cret@h:6379/0", "redis://:***@h:6379/0"),
        ("rediss://acpw:s3cret@h:6380/2", "rediss://acpw:***@h:6380/2"),
        (
            "rediss://h:6380/0?password=s3cret&ssl_ca_certs=/ca.pem",
            "rediss://h:6380/0?password=***&ssl_ca_certs=/ca.pem",
        ),
        (
            "sentinel://u:p1@a:26379;sentinel://u:p2@b:26379/1",
            "sentinel://u:***@a:26379;sentinel://u:***@b:26379/1",
        ),
        ("redis://h:6379/0", "redis://h:6379/0"),
    ],
)
def test_a_url_is_printed_without_its_secrets(url: str, shown: str) -> None:
    assert connect.redact(url) == shown


def test_redis_py_query_parameters_and_settings_make_one_tls_target(tmp_path: Path) -> None:
    settings = Settings(redis_tls_ca=tmp_path / "ca.pem", redis_tls_cert=tmp_path / "c.pem")
    t = connect.target("rediss://h:6380/3?ssl_ca_certs=/url-ca.pem&ssl_keyfile=/k", settings, {})
    assert t.tls
    assert t.verified
    assert t.db == 3
    assert t.url == "rediss://h:6380/3"  # the TLS parameters are arguments now
    assert t.ssl == {
        "ssl_cert_reqs": "required",
        "ssl_check_hostname": True,
        "ssl_ca_certs": "/url-ca.pem",  # the URL's wins
        "ssl_certfile": str(tmp_path / "c.pem"),
        "ssl_keyfile": "/k",
    }


def test_a_rediss_broker_is_verified_even_without_parameters() -> None:
    """kombu alone would connect a bare rediss:// broker with CERT_NONE."""
    config = celery_config(Settings(redis_url="rediss://h:6380/0"))
    assert config["broker_url"] == "rediss://h:6380/0"
    assert config["broker_use_ssl"]["ssl_cert_reqs"] == ssl.CERT_REQUIRED
    assert "visibility_timeout" in config["broker_transport_options"]


def test_the_acl_password_is_a_secret_reference(tmp_path: Path) -> None:
    settings = Settings(redis_username="acpw", redis_password="env:PW", secrets_dir=tmp_path)
    t = connect.target("redis://h:6379/0", settings, {"PW": "s3cret"})
    assert (t.username, t.password) == ("acpw", "s3cret")
    assert "s3cret" not in repr(t)
    assert "s3cret" not in str(t.describe())
    (tmp_path / "pw").write_text("from-file\n")
    filed = settings.model_copy(update={"redis_password": "file:pw"})
    assert connect.target("redis://h/0", filed, {}).password == "from-file"
    config = celery_config(filed.model_copy(update={"redis_url": "redis://h/0"}))
    assert config["broker_url"] == "redis://acpw:from-file@h/0"
    with pytest.raises(CredentialRefused):
        connect.target("redis://h/0", settings, {})


def test_verification_off_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="worker.store.connect"):
        t = connect.target("rediss://h:6380/0", Settings(redis_tls_verify=False), {})
    assert not t.verified
    assert "verification is OFF" in caplog.text
    assert t.ssl["ssl_cert_reqs"] == "none"


def test_sentinel_urls_need_a_master_and_name_their_sentinels() -> None:
    url = "sentinel://a:26379;sentinel://b:26380;sentinel://c/2"
    with pytest.raises(InvalidInput, match="ACPW_REDIS_SENTINEL_MASTER"):
        connect.target(url, Settings(), {})
    t = connect.target(url, Settings(redis_sentinel_master="mymaster"), {})
    assert t.sentinels == (("a", 26379), ("b", 26380), ("c", 26379))
    assert (t.master, t.db, t.tls) == ("mymaster", 2, False)
    broker = connect.broker_options(t)
    # kombu reads the database from the URL it fails over to: each one names it
    assert broker["broker_url"] == "sentinel://a:26379/2;sentinel://b:26380/2;sentinel://c/2"
    with_user = connect.target(url, Settings(redis_sentinel_master="m", redis_username="u"), {})
    assert connect.broker_options(with_user)["broker_url"] == (
        "sentinel://u@a:26379/2;sentinel://u@b:26380/2;sentinel://u@c/2"
    )  # each URL of the list: kombu fails over to the next with its own credentials
    assert broker["broker_transport_options"]["master_name"] == "mymaster"


def test_tls_sentinels_take_the_tls_files_when_the_master_is_plain(tmp_path: Path) -> None:
    """``ACPW_REDIS_SENTINEL_TLS`` without ``ACPW_REDIS_TLS``: the sentinel connections
    (store and broker) check the sentinels' certificates against ``ACPW_REDIS_TLS_CA``,
    never the system's trust store alone; the master stays plain."""
    ca = tmp_path / "ca.pem"
    settings = Settings(
        redis_sentinel_master="m", redis_sentinel_tls=True, redis_tls_ca=ca, redis_tls=False
    )
    t = connect.target("sentinel://a:26379;sentinel://b:26379/0", settings, {})
    assert (t.tls, t.sentinel_tls) == (False, True)
    transport = connect.broker_options(t)["broker_transport_options"]
    assert transport["sentinel_kwargs"]["ssl"] is True
    assert transport["sentinel_kwargs"]["ssl_ca_certs"] == str(ca)
    assert transport["sentinel_kwargs"]["ssl_cert_reqs"] == "required"
    assert "broker_use_ssl" not in connect.broker_options(t)


@pytest.mark.parametrize("url", ["http://h/0", "redis://a;redis://b", "sentinel://a;redis://b"])
def test_other_urls_are_refused(url: str) -> None:
    with pytest.raises(InvalidInput):
        connect.target(url, Settings(redis_sentinel_master="m"), {})


def test_the_store_label_of_a_sentinel_url_names_its_sentinels_not_a_password() -> None:
    from worker.store.owner import store_label

    one = store_label("sentinel://u:p1@a:26379;sentinel://b:26379/0")
    assert one == store_label("sentinel://u:p2@a:26379;sentinel://b:26379/0")
    assert one != store_label("sentinel://a:26379;sentinel://c:26379/0")
    # a single URL's label is what it always was (labels on running sandboxes keep matching)
    assert store_label("redis://:pw@h:6379/0") == store_label("redis://h:6379/0")
