# The two commands of README.md: `make dev` and `make test`. Both create .venv when missing.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN = $(VENV)/bin

.PHONY: dev test lint install install-dev clean loadgen

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# PySpark (jetstream.spark and its tests) runs on a Java 17+ runtime; nothing else needs Java.
JAVA_CHECK = $${JAVA_HOME:+$$JAVA_HOME/bin/}java -version 2>&1 | grep -Eq 'version "(1[7-9]|[2-9][0-9])' || echo "Spark needs Java 17 or newer and none was found: install a JRE 17+ (Debian/Ubuntu: apt install openjdk-17-jre-headless) or set JAVA_HOME" >&2

# Stamps re-run the install whenever the package metadata or a C part (the NATS parser's, the
# batch encoder's) changes (the install builds them in place; they are optional: without a C
# compiler both run in Python). An editable install compiles no Python, and a Python run with
# PYTHONDONTWRITEBYTECODE writes no bytecode, so every broker process would compile the
# package again as it starts: compile it once here.
COMPILE = $(BIN)/python -m compileall -q jetstream

INSTALL_INPUTS = setup.cfg setup.py pyproject.toml $(wildcard jetstream/*/_*_c.c) jetstream/_decimal.h jetstream/_big_endian.h

$(VENV)/.installed: $(BIN)/python $(INSTALL_INPUTS)
	$(BIN)/python -m pip install -q -e .
	@$(COMPILE)
	@$(JAVA_CHECK)
	touch $@

$(VENV)/.installed-dev: $(BIN)/python $(INSTALL_INPUTS)
	$(BIN)/python -m pip install -q -e '.[dev]'
	@$(COMPILE)
	@$(JAVA_CHECK)
	touch $@ $(VENV)/.installed

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

dev: install
	$(BIN)/jetstream dev

lint: install-dev
	$(BIN)/ruff check jetstream tests bench spark typings pyspark_jetstream.py
	$(BIN)/mypy

test: lint
	$(BIN)/python -m pytest -q

# The benches' load generator: a C program speaking the NATS protocol (bench/loadgen).
LOADGEN = bench/loadgen/build/loadgen
LOADGEN_CFLAGS ?= -O2 -g -Wall -Wextra -pthread

# TLS (OpenSSL) is built in when its headers are there (Debian/Ubuntu: libssl-dev).
LOADGEN_TLS := $(shell $(CC) -E -include openssl/ssl.h -x c /dev/null >/dev/null 2>&1 && echo yes)
LOADGEN_LIBS := $(if $(LOADGEN_TLS),-DLOADGEN_TLS -lssl -lcrypto)

loadgen: $(LOADGEN)

$(LOADGEN): bench/loadgen/loadgen.c
	@mkdir -p $(@D)
	$(CC) $(LOADGEN_CFLAGS) -o $@ $< $(LOADGEN_LIBS)

clean:
	rm -rf $(VENV) build *.egg-info bench/loadgen/build
