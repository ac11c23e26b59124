"""HTTPS on a live daemon (`listen.tls`): a private CA and a server certificate for 127.0.0.1 (an IP
SAN) made here with the openssl CLI; `tailguard status --url https://... --cacert CA` reads the table;
an untrusted or missing CA fails with one line and exit 1 (no traceback); plain HTTP to the TLS port
does not hurt the daemon; Alertmanager's webhook is posted over HTTPS trusting the CA."""
from __future__ import annotations

import asyncio
import os
import shutil
import socket
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator, Iterator

import aiohttp
import pytest

from daemon.wiring.cli import main
from daemon.wiring.registries import action_registry, detector_registry
from daemon.wiring.service import Service
from tests.support.helpers import TOKEN, local_settings, payload_with

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI")]

READER = "reader-token-https-5a1e9c0b"
TOKENS = f"- {{name: dashboards, token: {READER}, scopes: [read]}}\n"
POLICY = """
name: ranker-watch
target: {model: ranker}
triggers:
  - alert: {name: TritonTailLatencyHigh}
actions:
  - type: notify
    url: http://127.0.0.1:9/hook
guards: {dryRun: true}
"""


@dataclass(frozen=True)
class Pki:
    ca: Path  # the CA that signed the server's certificate
    cert: Path
    key: Path
    other_ca: Path  # a CA that signed nothing here


def _openssl(cwd: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _ca(cwd: Path, name: str) -> None:
    _openssl(cwd, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "2", "-subj", f"/CN=tailguard test {name}",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             "-addext", "subjectKeyIdentifier=hash")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    _ca(d, "ca")
    _ca(d, "other-ca")
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1\nbasicConstraints=critical,CA:FALSE\n"
                                  "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
                                  "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid:always\n")
    _openssl(d, "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=tailguard")
    _openssl(d, "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "server.crt", "-days", "2", "-extfile", "server.ext")
    return Pki(d / "ca.crt", d / "server.crt", d / "server.key", d / "other-ca.crt")


@pytest.fixture(autouse=True)
def api_tokens_env() -> Iterator[None]:
    os.environ["TAILGUARD_API_TOKENS"] = TOKENS
    yield
    os.environ.pop("TAILGUARD_API_TOKENS", None)


@pytest.fixture
async def svc(tmp_path: Path, pki: Pki) -> AsyncIterator[Service]:
    pol = tmp_path / "policies"
    pol.mkdir()
    (pol / "p.yaml").write_text(POLICY)
    settings = local_settings(tmp_path, pol, listen={"host": "127.0.0.1", "port": 0,
                                                     "tls": {"certFile": str(pki.cert), "keyFile": str(pki.key)}})
    async with Service(settings, action_registry(), detector_registry()) as s:
        yield s


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(READER + "\n")
    return path


def _one_line_error(err: str) -> str:
    assert "Traceback" not in err and err.count("\n") == 1 and err.startswith("error: "), err
    return err


async def test_status_over_https_with_the_ca_trusted(svc: Service, pki: Pki, token_file: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """`--cacert CA` (and env TAILGUARD_API_CACERT) verify the daemon's certificate: the table comes back."""
    url = f"https://127.0.0.1:{svc.port}"
    capsys.readouterr()
    assert await asyncio.to_thread(main, ["status", "--url", url, "--token-file", str(token_file),
                                          "--cacert", str(pki.ca)]) == 0
    table = capsys.readouterr().out
    assert "leader (acting)" in table and "policies: 1 loaded" in table
    os.environ["TAILGUARD_API_CACERT"] = str(pki.ca)
    try:
        assert await asyncio.to_thread(main, ["status", "--json", "--url", url, "--token-file", str(token_file)]) == 0
    finally:
        os.environ.pop("TAILGUARD_API_CACERT")
    assert '"role": "leader"' in capsys.readouterr().out


async def test_an_untrusted_certificate_fails_with_one_line(svc: Service, pki: Pki, token_file: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Another CA, or the system's CAs (no --cacert): exit 1 with one line naming the verification
    failure; a --cacert that is missing or not PEM: one line too."""
    url = f"https://127.0.0.1:{svc.port}"
    capsys.readouterr()
    for extra in (["--cacert", str(pki.other_ca)], []):
        assert await asyncio.to_thread(main, ["status", "--url", url, "--token-file", str(token_file), *extra]) == 1
        err = _one_line_error(capsys.readouterr().err)
        assert f"cannot reach {url}" in err and "CERTIFICATE_VERIFY_FAILED" in err
    for bad in (pki.ca.parent / "missing.crt", token_file):
        with pytest.raises(SystemExit) as exc:
            main(["status", "--url", url, "--token-file", str(token_file), "--cacert", str(bad)])
        assert str(exc.value).startswith(f"error: --cacert {bad}: ") and "\n" not in str(exc.value)


async def test_plain_http_to_the_tls_port_does_not_hurt_the_daemon(svc: Service, pki: Pki, token_file: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A plain-HTTP request (and raw garbage) to the TLS port is refused or dropped; the daemon keeps
    answering HTTPS. The CLI with an http:// URL to it fails with one line."""
    port = svc.port
    assert port is not None
    async with aiohttp.ClientSession() as http:
        try:
            async with http.get(f"http://127.0.0.1:{port}/healthz") as resp:
                assert resp.status >= 400  # never a plaintext answer from the TLS listener
        except aiohttp.ClientError:
            pass  # the listener drops the connection: what aiohttp reports
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        raw.sendall(b"\x00\xff" * 512 + b"GET / HTTP/1.1\r\n\r\n")
        raw.settimeout(5)
        try:
            raw.recv(4096)
        except (ConnectionError, TimeoutError):
            pass
    capsys.readouterr()
    assert await asyncio.to_thread(main, ["status", "--url", f"http://127.0.0.1:{port}",
                                          "--token-file", str(token_file)]) == 1
    _one_line_error(capsys.readouterr().err)
    context = ssl.create_default_context(cafile=str(pki.ca))
    async with aiohttp.ClientSession() as http:
        async with http.get(f"https://127.0.0.1:{port}/healthz", ssl=context) as resp:
            assert resp.status == 200
    assert await asyncio.to_thread(main, ["status", "--url", f"https://127.0.0.1:{port}",
                                          "--token-file", str(token_file), "--cacert", str(pki.ca)]) == 0


async def test_webhook_over_https(svc: Service, pki: Pki) -> None:
    """Alertmanager's POST over HTTPS (aiohttp trusting the CA) is journaled and decided."""
    context = ssl.create_default_context(cafile=str(pki.ca))
    async with aiohttp.ClientSession() as http:
        async with http.post(f"https://127.0.0.1:{svc.port}/api/v1/alerts", json=payload_with(), ssl=context,
                             headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
            assert resp.status == 200, await resp.text()
        with pytest.raises(aiohttp.ClientConnectorCertificateError):  # the server is verified, not trusted blindly
            async with http.post(f"https://127.0.0.1:{svc.port}/api/v1/alerts", json=payload_with(),
                                 ssl=ssl.create_default_context(cafile=str(pki.other_ca)),
                                 headers={"Authorization": f"Bearer {TOKEN}"}):
                pass
    await svc.drain()
    (decision,) = await svc.journal.decisions.all.in_thread()
    assert decision.policy == "ranker-watch" and decision.state == "dry_run"
    assert len(await svc.journal.signals.all.in_thread()) == 1
