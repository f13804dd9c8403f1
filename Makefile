# nala-mm: every target sets up the environment first (idempotent, seconds once built).
VENV ?= .venv
PY := $(VENV)/bin/python
export PYTHONUNBUFFERED := 1

.PHONY: setup lint test test-unit test-extended test-e2e demo demo-det bench ablation \
	out-norm-study swap-bench swap-study vit-bench linearize linearize-choices longrange-data \
	longrange clean-demo docs

setup:
	@bash tools/setup_env.sh

# Lint and import order (ruff.toml), before every test run.
lint: setup
	$(VENV)/bin/ruff check .

# The whole test suite: tiny models, tiny generated data.
test: lint
	$(PY) -m pytest tests -q -p no:cacheprovider -m "not slow and not extended"

# The process-starting checks make test leaves out: the tools and the upstream tools end to end,
# ONNX export through the tool, epoch-based two-rank training and dist_test.sh (each marked
# `extended` on the test itself).
test-extended: setup
	$(PY) -m pytest tests -q -p no:cacheprovider -m "extended and not slow"

# The inner loop: the suite without the tests that start processes (tools, torchrun).
test-unit: setup
	$(PY) -m pytest tests -q -p no:cacheprovider -m "not slow and not integration"

# Both demos end to end with their full schedules, asserting they learn.
test-e2e: setup
	$(PY) -m pytest tests -q -p no:cacheprovider -m slow

# Main job on the embedded default: synthetic ADE20K-layout data -> UperNet + NaLaFormer -> mIoU.
demo: setup
	$(PY) tools/demo.py seg

# COCO-format synthetic instances -> Mask R-CNN + NaLaFormer -> bbox/segm AP.
demo-det: setup
	$(PY) tools/demo.py det

# Every marked figure of README.md and docs/ written from its results file (tools/render_docs.py);
# the test suite fails on a figure that differs, so run this after re-measuring.
docs:
	python3 tools/render_docs.py

bench: setup
	$(PY) benchmarks/attention.py

# Token mixers at equal budget on the embedded data: 5 variants x 3 seeds x 200 iterations.
ablation: setup
	$(PY) benchmarks/ablation.py

# Detection demo with / without the per-output LayerNorms, and a ResNet-18 (3 runs of 10 epochs).
out-norm-study: setup
	$(PY) benchmarks/out_norm_study.py

# Stock Swin-T, MiT-B0 and PVTv2-B0 against their NaLa-swapped versions at 512/1024/2048
# (on a busy machine pin it: taskset -c 0 $(PY) benchmarks/swap.py --threads 1).
swap-bench: setup
	$(PY) benchmarks/swap.py

# A trained Swin's stages 1-2 swapped to NaLa and fine-tuned vs softmax continued, 3 seeds.
swap-study: setup
	$(PY) benchmarks/swap_finetune.py

# ViT-S/B stock, fused SDPA and NaLa at 512..4096, then SETR ViT-L whole vs sliding-window
# inference at Cityscapes' size.
vit-bench: setup
	$(PY) benchmarks/vit.py
	$(PY) benchmarks/vit_cityscapes.py

# A softmax-trained Swin (demo data) and ViT (long-range task) converted to NaLa by a plain swap
# or by attention transfer (tools/linearize.py), then fine-tuned, against softmax continued.
linearize: setup
	$(PY) benchmarks/linearize.py

# The attention transfer's design choices on the Swin teacher (target, inputs, parameters, lr),
# and the ViT teacher's zero-shot mIoU against the transfer's iterations.
linearize-choices: setup
	$(PY) benchmarks/linearize.py --choices
	$(PY) benchmarks/linearize.py --iterations

# The long-range exemplar task's data (ADE20K layout under data/longrange, deterministic).
longrange-data: setup
	$(PY) -m nala_mm.datasets.longrange

# Nine token mixers x three seeds on the long-range task, with the attention statistics
# (one thread per run).
longrange: setup
	$(PY) benchmarks/longrange.py

# The sdist and, built from it, the wheel (both carry nala_mm/.mim: configs, tools, model index).
dist: setup
	rm -rf dist build
	$(PY) -m build --no-isolation --outdir dist .

clean-demo:
	rm -rf data/demo work_dirs/demo*
