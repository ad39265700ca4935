"""The metrics push against hostile gateways (issue 54, item 1): real HTTP servers on loopback.

A gateway that redirects to another host (302, 303, 307) gets one request, with its credentials, and the other
host gets nothing; a gateway that answers one byte every two seconds, or never, costs one warning within the
push's deadline, never the command; an invalid push URL is refused with its password masked; job labels that are
not path segments (``.``, ``..``) push to Debian's real Pushgateway (skipped where it is not installed).

No timing is asserted beyond generous bounds: a slow gateway here would hold the command for minutes without the
deadline, and the bound only tells that apart.
"""

from __future__ import annotations

import base64
import http.server
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from verbatim_batch.engine.telemetry import push, session

PASSWORD = "s3cret-pw"
CLI = [sys.executable, "-c", "import sys; from verbatim_batch.cli import main; sys.exit(main())"]


class Recorder(http.server.ThreadingHTTPServer):
    """A loopback HTTP server recording each request (method, path, headers); ``answer`` decides the reply."""

    daemon_threads = True

    def __init__(self, host: str, answer) -> None:
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.answer = answer
        self.closed_early = threading.Event()  # the client went away while the server was still answering
        super().__init__((host, 0), _Handler)
        self.url = f"http://{host}:{self.server_address[1]}"

    def __enter__(self):
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
        self.server_close()


class _Handler(http.server.BaseHTTPRequestHandler):
    def _any(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self.server.requests.append((self.command, self.path, dict(self.headers)))
        try:
            self.server.answer(self)
        except (BrokenPipeError, ConnectionResetError):
            self.server.closed_early.set()

    do_GET = do_PUT = do_POST = _any

    def log_message(self, *args) -> None:
        pass


def _redirect(code: int, location: str):
    def answer(handler: _Handler) -> None:
        handler.send_response(code)
        handler.send_header("Location", location)
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    return answer


def _dribble(total_s: float):
    """One byte of a valid answer every two seconds, for ``total_s`` seconds at most."""
    def answer(handler: _Handler) -> None:
        text = b"HTTP/1.1 200 OK\r\n" + b"X-Slow: " + b"." * 400 + b"\r\nContent-Length: 0\r\n\r\n"
        until = time.monotonic() + total_s
        for byte in text:
            if time.monotonic() > until:
                return
            handler.wfile.write(bytes([byte]))
            handler.wfile.flush()
            time.sleep(2.0)

    return answer


def _silent(handler: _Handler) -> None:
    time.sleep(120)


def _rows() -> list:
    return session.samples(session.Session(command="chunk"), "committed")


def _warnings(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("verbatim-batch: warning:")]


def _other_host() -> str:
    """A second loopback address (the whole of 127/8 is loopback on Linux): "another host" by its address."""
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.2", 0))
    except OSError:
        pytest.skip("127.0.0.2 cannot be bound here: no second loopback host")
    return "127.0.0.2"


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
def test_a_redirect_to_another_host_is_not_followed_and_no_credential_goes_there(code, capsys):
    with Recorder(_other_host(), lambda h: h.send_error(500)) as other, \
            Recorder("127.0.0.1", _redirect(code, "")) as gateway:
        gateway.answer = _redirect(code, f"{other.url}/metrics/job/verbatim-batch")
        url = gateway.url.replace("http://", f"http://bob:{PASSWORD}@")
        assert not push.push(url, "verbatim-batch", "chunk", _rows(), replace=code % 2 == 0)
    err = capsys.readouterr().err
    warnings = _warnings(err)
    assert len(warnings) == 1 and err.strip() == warnings[0], err
    assert f"a redirect to {other.url}/metrics/job/verbatim-batch (another host); not followed" in warnings[0]
    assert PASSWORD not in err and "bob" not in err
    assert other.requests == []  # nothing, and no credential, went to the other host
    (method, path, headers), = gateway.requests
    assert method == ("PUT" if code % 2 == 0 else "POST")
    assert headers["Authorization"] == "Basic " + base64.b64encode(f"bob:{PASSWORD}".encode()).decode()


def test_a_gateway_that_never_answers_costs_one_warning_at_the_deadline(capsys):
    with Recorder("127.0.0.1", _silent) as gateway:
        started = time.monotonic()
        assert not push.push(gateway.url, "verbatim-batch", "chunk", _rows(), replace=True, deadline_s=1.0)
        took = time.monotonic() - started
    assert took < 60, took  # it would wait for the gateway's 120 s
    warnings = _warnings(capsys.readouterr().err)
    assert len(warnings) == 1 and "no complete answer within 1 s (the push's deadline)" in warnings[0], warnings


def test_report_against_a_gateway_answering_a_byte_every_two_seconds_ends_within_the_deadline(tmp_path):
    """`report` (refused: no such run) with --metrics-push at a gateway dribbling its answer, a byte every two
    seconds for up to 5 minutes: the command ends with its own line and one warning, well before the dribble."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    with Recorder("127.0.0.1", _dribble(300)) as gateway:
        started = time.monotonic()
        done = subprocess.run([*CLI, "report", str(tmp_path / "no-run"), "--metrics-push", gateway.url],
                              capture_output=True, text=True, timeout=280, env=env)
        took = time.monotonic() - started
        assert gateway.closed_early.wait(30)  # the push hung up on it
    assert done.returncode == 2, done.stderr[-3000:]
    assert took < 120, took
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("verbatim-batch report: error:"), done.stderr
    assert lines[1] == (f"verbatim-batch: warning: metrics not pushed to {gateway.url}: no complete answer within "
                        f"{push.DEADLINE_S:g} s (the push's deadline); given up")
    assert [m for m, _, _ in gateway.requests] == ["PUT"]  # a refused run: its own group, replaced


def test_a_refusing_gateway_says_why_in_one_line_without_the_password(capsys):
    def refuse(handler: _Handler) -> None:
        body = f"pushed metrics are invalid (Authorization: Basic {PASSWORD})\nsecond line".encode()
        handler.send_response(400)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    with Recorder("127.0.0.1", refuse) as gateway:
        url = gateway.url.replace("http://", f"http://bob:{PASSWORD}@")
        assert not push.push(url, "verbatim-batch", "chunk", _rows(), replace=False)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "answered 400 Bad Request: pushed metrics are invalid" in err, err
    assert PASSWORD not in err and f"metrics not pushed to {gateway.url}:" in err


@pytest.mark.parametrize("url", [f"http://bob:{PASSWORD}@gw:port", f"http://bob:{PASSWORD}@gw:99999",
                                 f"ftp://bob:{PASSWORD}@gw:9091", f"http://bob:{PASSWORD}@[::1",
                                 f"http://bob:{PASSWORD}@gw:9091/?x=1"])
def test_an_invalid_push_url_is_refused_in_one_line_with_its_password_masked(url, tmp_path, capsys):
    from verbatim_batch.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["report", str(tmp_path), "--metrics-push", url])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and "--metrics-push" in err, err
    assert PASSWORD not in err and "bob" not in err, err
    config = tmp_path / "c.yaml"
    config.write_text(f"metrics_push: '{url}'\n")
    with pytest.raises(SystemExit) as stop:
        main(["report", str(tmp_path), "--config", str(config)])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and PASSWORD not in err and "bob" not in err, err


def test_every_label_goes_base64_encoded_in_the_path():
    path = push.group_path("..", {"command": "chunk"})
    assert path == "/metrics/job@base64/Li4=/command@base64/Y2h1bms="
    assert push.group_path("", {}) == "/metrics/job@base64/="


@pytest.fixture(scope="module")
def pushgateway(tmp_path_factory):
    from promservers import PUSHGATEWAY, Pushgateway

    if PUSHGATEWAY is None:
        pytest.skip("prometheus-pushgateway is not installed (apt-get install prometheus-pushgateway; CI does)")
    with Pushgateway(tmp_path_factory.mktemp("pgw")) as gateway:
        yield gateway.url


@pytest.mark.parametrize("job", [".", "..", "a.b", "-", "_x_", "9" * 64])
def test_every_accepted_job_label_pushes_to_a_real_pushgateway(pushgateway, job, capsys):
    """Each job label `--metrics-job` accepts (``.`` and ``..`` once ended as 404/405) lands as its group."""
    from verbatim_batch.engine.telemetry.options import _job_label

    assert _job_label(job) == job
    assert push.push(pushgateway, job, "chunk", _rows(), replace=True)
    assert push.push(pushgateway, job, "chunk", _rows(), replace=False)
    assert capsys.readouterr().err == ""
    text = urllib.request.urlopen(pushgateway + "/metrics", timeout=30).read().decode()
    assert f'verbatim_runs_total{{command="chunk",instance="",job="{job}",status="committed"}} 1' in text


def test_the_push_deadline_is_declared_once_and_documented():
    docs = (Path(__file__).resolve().parents[1] / "docs" / "operations.md").read_text(encoding="utf-8")
    assert f"gives up after {push.DEADLINE_S:g} seconds" in docs


def test_a_sigterm_while_the_push_waits_ends_with_143_and_the_one_line(tmp_path):
    """A SIGTERM that lands while the metrics wait on a silent gateway: exit 143 and the command's one line last
    (the signal handlers were put back before the push, so the default ended it with no line)."""
    import signal

    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    with Recorder("127.0.0.1", _silent) as gateway:
        proc = subprocess.Popen([*CLI, "report", str(tmp_path / "no-run"), "--metrics-push", gateway.url],
                                stderr=subprocess.PIPE, text=True, env=env,
                                preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))
        try:
            deadline = time.monotonic() + 120
            while not gateway.requests and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
            assert gateway.requests, "the push never reached the gateway"
            proc.send_signal(signal.SIGTERM)
            err = proc.communicate(timeout=120)[1]
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 143, err
    lines = err.strip().splitlines()
    assert lines[0].startswith("verbatim-batch report: error:") and "Traceback" not in err, err
    assert lines[-1].startswith("verbatim-batch report: terminated (SIGTERM)") and len(lines) == 2, err
