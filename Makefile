# nala-mm: every target sets up the environment first (idempotent, seconds once built).
VENV ?= .venv
PY := $(VENV)/bin/python
export PYTHONUNBUFFERED := 1

.PHONY: setup lint test test-unit test-extended test-e2e test-cuda gpu-wheels demo demo-det \
	demo-cls docs bench dist clean-demo

setup:
	@bash tools/setup_env.sh

# Lint and import order (ruff.toml), before every test run.
lint: setup
	$(VENV)/bin/ruff check .

# The whole test suite: tiny models, tiny generated data. Each target collects pytest.ini's
# testpaths: tests/, projects/*/tests and benchmarks/tests.
test: lint
	$(PY) -m pytest -q -p no:cacheprovider -m "not e2e and not extended"

# The process-starting checks make test leaves out: the tools and the upstream tools end to end,
# ONNX export through the tool, epoch-based two-rank training and dist_test.sh (each marked
# `extended` on the test itself; the suites are listed in pytest.ini).
test-extended: setup
	$(PY) -m pytest -q -p no:cacheprovider -m extended

# The inner loop: make test without the tests that start processes (tools, torchrun).
test-unit: setup
	$(PY) -m pytest -q -p no:cacheprovider -m "not e2e and not extended and not integration"

# Both demos end to end with their full schedules, asserting they learn.
test-e2e: setup
	$(PY) -m pytest -q -p no:cacheprovider -m e2e

# On a GPU machine (set up with FORCE_CUDA=1 and a CUDA torch, README): the device-parametrised
# parity tests on CUDA, float64 formulas, fast vs reference, fp16 autocast.
test-cuda: setup
	$(PY) -m pytest -q -p no:cacheprovider -m cuda

# The wheels of the GPU check (benchmarks/gpu_check.py) into .gpu_wheels/: carry/ travels to a GPU
# machine without network; machine/ is that machine's own packages, for the rehearsal in
# test-extended (tests/test_gpu_check.py). About 2.7 GB, once.
gpu-wheels:
	bash tools/fetch_gpu_wheels.sh

# Main job on the embedded default: synthetic ADE20K-layout data -> UperNet + NaLaFormer -> mIoU.
demo: setup
	$(PY) tools/demo.py seg

# COCO-format synthetic instances -> Mask R-CNN + NaLaFormer -> bbox/segm AP.
demo-det: setup
	$(PY) tools/demo.py det

# ImageNet-layout synthetic images -> mmpretrain ImageClassifier + NaLaFormer -> top-1.
demo-cls: setup
	$(PY) tools/demo.py cls

# Every marked figure of README.md and docs/ written from its results file (tools/render_docs.py);
# the test suite fails on a figure that differs, so run this after re-measuring.
docs:
	python3 tools/render_docs.py

# Any benchmark or study by name (python -m benchmarks list), with its own arguments:
#   make bench NAME=vit ARGS='--sizes 512 1024'      make bench NAME=ablation ARGS=--report-only
NAME ?= attention
bench: setup
	$(PY) -m benchmarks run $(NAME) $(ARGS)

# The sdist and, built from it, the wheel (both carry nala_mm/.mim: configs, tools, model index).
dist: setup
	rm -rf dist build
	$(PY) -m build --no-isolation --outdir dist .

clean-demo:
	rm -rf data/demo work_dirs/demo*
