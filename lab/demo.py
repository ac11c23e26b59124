"""`make demo`: the incident, live, on real local servers. Triton serves ranker v1; a deploy of v2
sends 3% of requests down a 600 ms path; tailguard sees the P99.9 tail and rolls back to v1."""
from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

from tritonclient.http.aio import InferenceServerClient

from daemon.common.config import Settings
from daemon.common.logs import configure_logging
from daemon.wiring.registries import action_registry, detector_registry
from daemon.wiring.service import Service
from lab.alertmanager import AlertmanagerServer
from lab.load import run_load
from lab.ports import free_port
from lab.prometheus import PrometheusServer
from lab.triton import TritonServer, write_model_repository

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "demo-token"
RULES = """
groups:
  - name: triton
    rules:
      - alert: TritonTailLatencyHigh
        expr: max by (model) (nv_inference_request_summary_us{quantile="0.999"}) > 500000
        for: 30s
        labels: {severity: page}
        annotations: {summary: "P99.9 of {{ $labels.model }} above 500 ms"}
"""
BASELINE_SECONDS = 30.0
WATCH_SECONDS = 90.0


def say(t0: float, text: str) -> None:
    print(f"[{time.monotonic() - t0:6.1f}s] {text}", flush=True)


def served(server: TritonServer) -> list[str]:
    req = urllib.request.Request(f"{server.base_url}/v2/repository/index", data=b"{}", method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        return sorted(e["version"] for e in json.load(resp) if e.get("state") == "READY")


def p999_ms(prom: PrometheusServer, version: str | None = None) -> str:
    # Per version when asked: the unloaded version's summary window still holds its slow requests.
    match = f',version="{version}"' if version else ""
    q = f'max by (model) (nv_inference_request_summary_us{{model="ranker"{match},quantile="0.999"}})'
    url = f"{prom.url}/api/v1/query?" + urllib.parse.urlencode({"query": q})
    with urllib.request.urlopen(url, timeout=5) as resp:
        result = json.load(resp)["data"]["result"]
    return f"{float(result[0]['value'][1]) / 1000:.1f} ms" if result else "no data"


def firing_alerts(am: AlertmanagerServer) -> list[str]:
    with urllib.request.urlopen(f"{am.url}/api/v2/alerts", timeout=5) as resp:
        return [a["labels"]["alertname"] for a in json.load(resp) if a["status"]["state"] == "active"]


async def load_version(server: TritonServer, version: int | None) -> None:
    client = InferenceServerClient(server.http_url, conn_timeout=60)
    try:
        if version is None:
            await client.load_model("ranker")  # re-read from disk: newest version, as a deploy does
        else:
            config = await client.get_model_config("ranker")
            config["version_policy"] = {"specific": {"versions": [version]}}
            await client.load_model("ranker", config=json.dumps(config))
    finally:
        await client.close()


async def main() -> None:
    configure_logging("console", "warning")
    work = Path(tempfile.mkdtemp(prefix="tailguard-demo-"))
    t0 = time.monotonic()
    model = write_model_repository(work / "models", slow_fraction_by_version={1: 0.0, 2: 0.03},
                                   slow_ms=600, fast_ms=3, instances=2)
    triton = TritonServer(work / "models", models=[model.name], workdir=work / "triton")
    await asyncio.to_thread(triton.start)
    await load_version(triton, 1)
    say(t0, f"Triton up at {triton.base_url}, ranker serves v{','.join(served(triton))}")
    port = free_port()
    am = AlertmanagerServer(f"http://127.0.0.1:{port}/api/v1/alerts", bearer_token=TOKEN,
                            group_wait="5s", workdir=work / "am")
    await asyncio.to_thread(am.start)
    rules = work / "rules.yaml"
    rules.write_text(RULES)
    prom = PrometheusServer({"triton": [triton.metrics_target]}, scrape_interval="1s",
                            evaluation_interval="5s", rule_files=[rules], alertmanager_targets=[am.target],
                            workdir=work / "prom")
    await asyncio.to_thread(prom.start)
    policies = work / "policies"
    policies.mkdir()
    text = (ROOT / "examples" / "policies" / "ranker.yaml").read_text()
    (policies / "ranker.yaml").write_text(text.replace("http://127.0.0.1:8000", triton.base_url))
    os.environ["TAILGUARD_WEBHOOK_TOKEN"] = TOKEN
    settings = Settings.model_validate({
        "listen": {"host": "127.0.0.1", "port": port},
        "policies": {"path": str(policies)},
        "journal": {"path": str(work / "journal.db")},
        "prometheus": {"url": prom.url},
    })
    try:
        async with Service(settings, action_registry(), detector_registry()) as svc:
            say(t0, f"tailguard on :{port}, Prometheus {prom.url}, Alertmanager {am.url}")
            load = asyncio.create_task(run_load(triton.base_url, rate_per_second=25,
                                                duration_seconds=BASELINE_SECONDS + WATCH_SECONDS))
            say(t0, f"sending 25 req/s; {BASELINE_SECONDS:.0f}s of healthy traffic for the baseline")
            await asyncio.sleep(BASELINE_SECONDS)
            say(t0, f"P99.9 before the deploy: {p999_ms(prom)}")
            deploy = time.monotonic()
            await load_version(triton, None)
            say(t0, f"DEPLOY: ranker now serves v{','.join(served(triton))} (3% of requests take 600 ms)")
            decided = None
            while time.monotonic() - deploy < WATCH_SECONDS and decided is None:
                await asyncio.sleep(1)
                decided = next(iter(await svc.journal.decisions()), None)
            await svc.drain()
            if decided is None:
                say(t0, "no decision within the watch window (see the journal below)")
            else:
                say(t0, f"tailguard acted {time.monotonic() - deploy:.1f}s after the deploy; "
                        f"Alertmanager alerts firing by then: {firing_alerts(am) or 'none'} "
                        f"(the P99.9 rule needs 30s above 500 ms first)")
            await asyncio.sleep(3)
            now_serving = ",".join(served(triton))
            say(t0, f"ranker now serves v{now_serving}; P99.9 of v{now_serving}: {p999_ms(prom, now_serving)}")
            load.cancel()
            await asyncio.gather(load, return_exceptions=True)
            print("\njournal:")
            for d in await svc.journal.decisions():
                sigs = {s["id"]: s for s in await svc.journal.signals()}
                sig = sigs[d.signal_id]["payload"]
                print(f"  signal  {sig['source']}/{sig['name']} value={sig['value']} "
                      f"reason={sig['details'].get('reason', '')}")
                print(f"  policy  {d.policy} -> {d.state}: {d.reason}")
                for step in d.plan.get("steps", []):
                    print(f"  plan    {step['summary']}")
                for s in await svc.journal.steps(d.id):
                    if s["phase"] == "intent":
                        continue  # written before each apply, for crash recovery; not news
                    print(f"  {s['phase']:<7} {s['status']}: {s['message']}")
    finally:
        for server in (prom, am, triton):
            await asyncio.to_thread(server.stop)


if __name__ == "__main__":
    asyncio.run(main())
