"""The container image: `make image` builds it (podman here), and it starts the way the chart runs it.

One build per module. Where no builder can run, every test fails with a setup message: an image
that was never built is not a pass. Each container a test starts has a name it chose and is
removed by that name when the test ends.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from lab.ports import free_port
from tests.support.paths import CHART_DIR, REPO

pytestmark = [pytest.mark.integration, pytest.mark.slow]

UID = 10001
TOKEN = "image-test-token"
BUILD_TIMEOUT_SECONDS = 1800  # cold: base assembly plus every wheel from PyPI (docs/image.md)
# runc, host network, no default ulimits: what starts a container on these hosts (docs/image.md).
RUN = ["run", "--runtime", "/usr/sbin/runc", "--network=host"]


def chart_image() -> str:
    """The image the chart installs by default: <image.repository>:<appVersion>."""
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    return f"{values['image']['repository']}:{values['image']['tag'] or chart['appVersion']}"


@pytest.fixture(scope="module")
def podman_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment podman needs here; fails (never skips) when podman cannot be found."""
    if shutil.which("podman") is None or not Path("/usr/sbin/runc").exists():
        pytest.fail("setup: no container builder can run here: podman and runc are not installed "
                    "(make system-deps installs podman buildah runc debootstrap)", pytrace=False)
    conf = tmp_path_factory.mktemp("podman") / "containers.conf"
    conf.write_text("[containers]\ndefault_ulimits = []\n")
    return {**os.environ, "CONTAINERS_CONF": str(conf)}


@pytest.fixture(scope="module")
def image(podman_env: dict[str, str]) -> str:
    """`make image` with podman as the builder; the image reference the chart names."""
    started = time.monotonic()
    built = subprocess.run(["make", "-s", "image"], cwd=REPO, env={**podman_env, "TAILGUARD_IMAGE_BUILDER": "podman"},
                           capture_output=True, text=True, timeout=BUILD_TIMEOUT_SECONDS)
    log = (built.stdout + built.stderr)[-6000:]
    if built.returncode == 3:  # build-image.sh: no builder can run here
        pytest.fail(f"setup: no container builder can run here:\n{log}", pytrace=False)
    assert built.returncode == 0, f"make image failed (exit {built.returncode}):\n{log}"
    print(f"make image took {time.monotonic() - started:.0f} s")
    ref = chart_image()
    assert podman(podman_env, "image", "exists", ref).returncode == 0, f"make image did not build {ref}:\n{log}"
    return ref


def podman(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], env=env, capture_output=True, text=True, timeout=timeout)


@contextlib.contextmanager
def container_name(env: dict[str, str]) -> Iterator[str]:
    """A fresh container name; whatever ran under it is removed (with its anonymous volumes)."""
    name = f"tailguard-image-test-{uuid.uuid4().hex[:10]}"
    try:
        yield name
    finally:
        podman(env, "rm", "--force", "--volumes", "--ignore", name)


def test_chart_installs_the_image_make_image_builds(image: str) -> None:
    """The Deployment the chart renders with default values names exactly the image built."""
    from tests.support.helm_render import find, render  # the Helm engine, only for this test

    deployment = find(render(), "Deployment")[0]
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == image


def test_help_runs_in_the_image(image: str, podman_env: dict[str, str]) -> None:
    """`tailguard --help` works from the image's entrypoint."""
    with container_name(podman_env) as name:
        done = podman(podman_env, *RUN, "--name", name, image, "--help")
    assert done.returncode == 0, done.stderr
    assert "usage: tailguard" in done.stdout
    assert "run" in done.stdout and "validate" in done.stdout


def test_image_user_is_the_charts_numeric_non_root_user(image: str, podman_env: dict[str, str]) -> None:
    """The image's USER is numeric 10001:10001, the uid/gid the chart's securityContext names."""
    user = podman(podman_env, "image", "inspect", "--format", "{{.Config.User}}", image)
    assert user.stdout.strip() == f"{UID}:{UID}"
    with container_name(podman_env) as name:
        ids = podman(podman_env, *RUN, "--name", name, "--entrypoint", "id", image)
    assert ids.returncode == 0, ids.stderr
    assert ids.stdout.startswith(f"uid={UID}(tailguard) gid={UID}(tailguard)"), ids.stdout


def test_daemon_serves_healthz_as_uid_10001_on_a_read_only_root(
        image: str, podman_env: dict[str, str], tmp_path: Path) -> None:
    """The image's default command starts the daemon as the chart runs it (read-only root, no
    capabilities); /healthz and /readyz answer over loopback, and the process runs as uid 10001."""
    port = free_port()
    etc = tmp_path / "etc"
    (etc / "policies").mkdir(parents=True)
    (etc / "policies" / "p.yaml").write_text(
        "name: p\ntarget: {model: ranker}\ntriggers:\n  - alert: {name: TritonTailLatencyHigh}\n"
        "actions:\n  - {type: notify, url: 'http://127.0.0.1:9/'}\n"
        "verify: {query: 'vector(0)', below: 1, onNotRecovered: none}\n")  # required: alert-only
    (etc / "config.yaml").write_text(yaml.safe_dump({
        "listen": {"host": "127.0.0.1", "port": port},
        "policies": {"path": "/etc/tailguard/policies"},
        "journal": {"path": "/var/lib/tailguard/journal.db"},
        "log": {"format": "json"},
    }))
    # The daemon (uid 10001) reads the mounted config; pytest's tmp dirs are 0700.
    for path in (tmp_path, etc, etc / "policies"):
        path.chmod(0o755)
    with container_name(podman_env) as name:
        started = podman(podman_env, *RUN, "--detach", "--name", name, "--read-only", "--cap-drop=ALL",
                         "--security-opt=no-new-privileges", "--env", f"TAILGUARD_WEBHOOK_TOKEN={TOKEN}",
                         "--volume", f"{etc}:/etc/tailguard:ro", image)
        assert started.returncode == 0, started.stderr

        def logs() -> str:
            out = podman(podman_env, "logs", name)
            return (out.stdout + out.stderr)[-4000:]

        health = wait_http_ok(f"http://127.0.0.1:{port}/healthz", 60.0, lambda: is_running(podman_env, name))
        assert health is not None, f"/healthz never answered 200:\n{logs()}"
        ready = wait_http_ok(f"http://127.0.0.1:{port}/readyz", 30.0, lambda: is_running(podman_env, name))
        assert ready is not None, f"/readyz never answered 200 (policies, journal):\n{logs()}"

        pid = podman(podman_env, "inspect", "--format", "{{.State.Pid}}", name).stdout.strip()
        status = Path(f"/proc/{pid}/status").read_text()
        uids = next(line.split()[1:] for line in status.splitlines() if line.startswith("Uid:"))
        assert uids == [str(UID)] * 4, f"daemon uids (real, effective, saved, fs): {uids}"
        stopped = podman(podman_env, "stop", "--time", "20", name, timeout=60)
        assert stopped.returncode == 0, stopped.stderr
        code = podman(podman_env, "inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip()
        assert code == "0", f"exit {code} after SIGTERM:\n{logs()}"


def test_prophet_fits_on_a_read_only_root(image: str, podman_env: dict[str, str]) -> None:
    """The forecaster's Stan backend (a compiled binary in the prophet wheel) runs in the image,
    writing only to /tmp: its shared libraries are there and the read-only root does not stop it."""
    script = ("import numpy as np, pandas as pd\nfrom prophet import Prophet\n"
              "df = pd.DataFrame({'ds': pd.date_range('2024-01-01', periods=60, freq='min'), 'y': np.arange(60.0)})\n"
              "m = Prophet().fit(df)\n"
              "print(round(float(m.predict(m.make_future_dataframe(5, freq='min'))['yhat'].iloc[-1])))\n")
    with container_name(podman_env) as name:
        done = podman(podman_env, *RUN, "--name", name, "--read-only", "--entrypoint", "python3", image, "-c", script)
    assert done.returncode == 0, done.stderr[-4000:]
    assert abs(int(done.stdout.strip().splitlines()[-1]) - 64) <= 1, done.stdout


def is_running(env: dict[str, str], name: str) -> bool:
    state = podman(env, "inspect", "--format", "{{.State.Running}}", name)
    return state.stdout.strip() == "true"


# Loopback, never through an HTTP(S)_PROXY the environment may set.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def wait_http_ok(url: str, timeout_seconds: float, alive: Callable[[], bool]) -> int | None:
    """Poll url until it answers 200 (returns 200); None at the timeout or once alive() is false."""
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        try:
            with _DIRECT.open(url, timeout=2) as resp:
                if resp.status == 200:
                    return 200
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass  # not listening yet (or not ready): poll again
        if not alive():
            return None
        time.sleep(0.5)
    return None
