# Two entry points (see README): `make demo` runs tailguard against real local servers,
# `make test` runs the whole suite (`make unit`: only the quick unit run). All install what they need first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup system-deps demo test unit lint bench eval clean image

# Prometheus and Alertmanager for the lab; podman, buildah, runc and debootstrap build and run the
# image (tests/image; runc because crun cannot start containers on these hosts, docs/image.md);
# PostgreSQL for the journal's second backend (tests/support/postgres.py runs its own cluster from
# /usr/lib/postgresql/<version>/bin).
system-deps:
	@command -v prometheus >/dev/null && command -v prometheus-alertmanager >/dev/null && command -v promtool >/dev/null \
		&& command -v podman >/dev/null && command -v buildah >/dev/null && test -x /usr/sbin/runc \
		&& test -x /usr/sbin/debootstrap && ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { \
		echo "installing Prometheus, Alertmanager, podman, buildah, runc, debootstrap and PostgreSQL (Debian packages)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			prometheus prometheus-alertmanager podman buildah runc debootstrap postgresql >/dev/null; }

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

setup: system-deps $(STAMP)

demo: setup
	$(PY) -m lab.demo

# The quick unit run first (no process, no server: tests/support/spawn_guard.py; pytest prints its
# duration), then the rest: the two selections are every test, each once.
UNIT := not integration and not slow

test: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy
	$(PY) scripts/check_module_size.py
	$(PY) scripts/check_duplicates.py
	@echo 'the quick unit run: -m "$(UNIT)"'
	$(PY) -m pytest -q -p no:cacheprovider -m "$(UNIT)"
	@echo 'the rest: -m "integration or slow" (real servers, processes, slow tests)'
	$(PY) -m pytest -q -p no:cacheprovider -m "integration or slow" --durations=20

unit: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m "$(UNIT)"

# The daemon image, tagged as the chart's default image (<image.repository>:<appVersion>), with
# docker, podman or buildah; assembles the Debian base with debootstrap when no registry answers.
image:
	bash scripts/build-image.sh

bench: setup
	$(PY) bench/bench_tail.py
	$(PY) bench/bench_forecast.py
	$(PY) bench/bench_intake.py $(BENCH_INTAKE_FLAGS)
	$(PY) bench/bench_poll_cycle.py $(BENCH_POLL_CYCLE_FLAGS)
	$(PY) bench/bench_ttr.py $(BENCH_TTR_FLAGS)
	$(PY) bench/bench_healthy.py $(BENCH_HEALTHY_FLAGS)

eval: setup
	$(PY) -m evaluation.tail_eval
	$(PY) -m evaluation.forecast_eval

clean:
	rm -rf $(VENV) .tailguard
