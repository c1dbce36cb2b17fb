"""An S3 cache the client cannot use is one ``RemoteError`` naming the URL, as an HTTP one is.

Found by the acceptance audit of issue 6: botocore's exceptions are not ``OSError``s, so a missing
credential (``NoCredentialsError``) and an endpoint nobody answers on (``EndpointConnectionError``,
after 17 s) escaped ``ShardStream("s3://...")`` as a page of botocore traceback, where the docs
promise a ``RemoteError`` naming the URL. Real moto S3 server on 127.0.0.1; a real closed port.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cachebuild.errors import RemoteError
from loaders import ShardStream
from loaders.remote import RemoteOptions
from ports import free_port
from remote_fixtures import moto_s3


@pytest.fixture
def no_aws_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No credentials anywhere botocore looks (environment, files, instance metadata)."""
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def _stream(url: str, tmp_path: Path, storage: dict) -> ShardStream:
    opts = RemoteOptions(cache_dir=str(tmp_path / "local"), timeout_s=2.0, retries=1, storage_options=tuple(storage.items()))
    return ShardStream(url, view="records", batch_size=8, remote=opts)


@pytest.mark.dist
@pytest.mark.timeout(180)
def test_s3_without_credentials_is_a_remote_error_naming_the_url(tmp_path: Path, no_aws_environment: None) -> None:
    pytest.importorskip("s3fs")
    with moto_s3() as (_, options):
        anonymous_client = {"client_kwargs": options["client_kwargs"]}  # the endpoint, no key
        with pytest.raises(RemoteError, match=r"cannot fetch s3://cachebuild-test/c/manifest\.json after 2 attempts: NoCredentialsError"):
            _stream("s3://cachebuild-test/c", tmp_path, anonymous_client)


@pytest.mark.dist
@pytest.mark.timeout(180)
def test_an_s3_endpoint_nobody_answers_is_a_remote_error_naming_the_url(tmp_path: Path, no_aws_environment: None) -> None:
    pytest.importorskip("s3fs")
    closed = f"http://127.0.0.1:{free_port()}"
    storage = {"key": "k", "secret": "s", "client_kwargs": {"endpoint_url": closed, "region_name": "us-east-1"}, "config_kwargs": {"retries": {"max_attempts": 1}}}
    with pytest.raises(RemoteError, match=r"cannot fetch s3://b/c/manifest\.json after 2 attempts: EndpointConnectionError"):
        _stream("s3://b/c", tmp_path, storage)
