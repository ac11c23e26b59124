#!/usr/bin/env bash
# Runs tailguard under a time-to-remediate rig's `--remediator-cmd` contract: the example policy
# (examples/policies/ranker.yaml) unchanged except for the endpoints, which come from the rig's
# environment (RIG_PROMETHEUS_URL, RIG_TRITON_URL, RIG_TRITON_METRICS_URL, RIG_REMEDIATOR_PORT,
# RIG_WORKDIR; RIG_WEBHOOK_REGISTER_URL, when set, forwards Alertmanager's webhooks here).
# TG_BIN: the tailguard console script (default: the one on PATH). TG_KEEP_WARM=1 adds
# `keepWarm: previous` to the rollback (the previous version kept loaded: a switch, not a load).
set -eu
here="$(cd "$(dirname "$0")/.." && pwd)"
tg="${TG_BIN:-tailguard}"
w="$RIG_WORKDIR/tailguard"; mkdir -p "$w/policies"
metrics="${RIG_TRITON_METRICS_URL:-${RIG_TRITON_URL%:*}:8002/metrics}"
sed -e "s#endpoints: \[\"http://127.0.0.1:8000\"\]#endpoints: [\"$RIG_TRITON_URL\"]#" \
    -e "s#metricsEndpoints: \[\"http://127.0.0.1:8002/metrics\"\]#metricsEndpoints: [\"$metrics\"]#" \
    "$here/examples/policies/ranker.yaml" > "$w/policies/ranker.yaml"
grep -q "$RIG_TRITON_URL" "$w/policies/ranker.yaml" || { echo "endpoint not filled in" >&2; exit 1; }
if [ "${TG_KEEP_WARM:-0}" = 1 ]; then
  sed -i -e "s#^    requireAttribution: true  \(.*\)#    requireAttribution: true  \1\n    keepWarm: previous#" "$w/policies/ranker.yaml"
  grep -q "keepWarm: previous" "$w/policies/ranker.yaml" || { echo "keepWarm not added" >&2; exit 1; }
fi
cat > "$w/config.yaml" <<YAML
listen: {host: 127.0.0.1, port: $RIG_REMEDIATOR_PORT}
webhook: {allowUnauthenticated: true}
policies: {path: $w/policies}
journal: {path: $w/journal.db}
prometheus: {url: $RIG_PROMETHEUS_URL}
log: {format: json, level: info}
# One target: the common-cause hold (on by default: a lone target waits blastRadius.quietHoldSeconds,
# 15 s, before any action) would only add that wait; off here, as in the runs measured before it.
blastRadius: {maxTargetsPerWindow: null, commonCauseTargets: null}
YAML
"$tg" validate "$w/policies" >&2
if [ -n "${RIG_WEBHOOK_REGISTER_URL:-}" ]; then
  ( for _ in $(seq 1 50); do   # once the daemon listens; bounded
      sleep 0.2
      python3 - "$RIG_WEBHOOK_REGISTER_URL" "http://127.0.0.1:$RIG_REMEDIATOR_PORT/api/v1/alerts" <<'PY' && break
import json, sys, urllib.request
req = urllib.request.Request(sys.argv[1], json.dumps({"url": sys.argv[2]}).encode(),
                             {"Content-Type": "application/json"})
urllib.request.urlopen(req, timeout=2).read()
PY
    done ) >/dev/null 2>&1 &
fi
exec "$tg" run --config "$w/config.yaml"
