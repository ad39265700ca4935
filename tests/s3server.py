"""A real S3 endpoint on loopback for tests: moto's server, spoken to over HTTP by pyarrow's S3 client.

S3 itself is outside this machine, so this is the one stand-in: moto implements the S3 protocol
(multipart uploads, listings, CopyObject, deletes) in a local process, and everything on our side
(pyarrow's S3FileSystem, Ray workers, the run commit) is the production code path.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pyarrow.fs as pafs

ACCESS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
          "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def s3_server(bucket: str = "verbatim-test") -> Iterator[dict[str, str]]:
    """Start moto's S3 server, create ``bucket``; yields the environment a client (or a Ray job) needs."""
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto's S3 server did not start") from None
                time.sleep(0.2)
        env = ACCESS | {"AWS_ENDPOINT_URL": endpoint}
        pafs.S3FileSystem(endpoint_override=endpoint, access_key="testing", secret_key="testing",
                          region="us-east-1", allow_bucket_creation=True).create_dir(bucket)
        yield env
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextmanager
def environment(env: dict[str, str]) -> Iterator[None]:
    """``env`` set in this process (for the test's own reads), restored after."""
    from verbatim_batch.core import storage

    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    storage._filesystem.cache_clear()
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        storage._filesystem.cache_clear()
