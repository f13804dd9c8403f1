# nala-mm: every target sets up the environment first (idempotent, seconds once built).
VENV ?= .venv
PY := $(VENV)/bin/python
export PYTHONUNBUFFERED := 1

.PHONY: setup lint test test-unit test-extended test-e2e test-cuda demo demo-det demo-cls docs dist \
	clean-demo longrange-data bench backbone-bench segmentor-bench swap-bench vit-bench \
	vit-cityscapes-bench vitdet-bench amp-bench conv-bench deploy-bench compile-bench ablation out-norm-study swap-study \
	linearize linearize-choices linearize-iterations linearize-vitdet demo-results longrange \
	longrange-graded flops-table gpu-wheels

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

# Benchmarks: each is a module run from the repository root, writing
# benchmarks/results/{speed,studies}/NAME.{json,md,png}; `$(PY) -m MODULE --report-only` writes
# a page again from its JSON. After re-measuring, `make docs`.
# The NaLa op and layer against the released op sequence, explicit softmax and SDPA.
bench: setup
	$(PY) -m benchmarks.speed.attention

# NaLaFormer-T (hybrid, all-linear, released mixers) against Swin-T, forward and training step.
backbone-bench: setup
	$(PY) -m benchmarks.speed.backbone

# UperNet + NaLaFormer-T against UperNet + Swin-T.
segmentor-bench: setup
	$(PY) -m benchmarks.speed.segmentor

# Stock Swin-T, MiT-B0 and PVTv2-B0 against their NaLa-swapped versions at 512/1024/2048
# (on a busy machine pin it: taskset -c 0 $(PY) -m benchmarks.speed.swap --threads 1).
swap-bench: setup
	$(PY) -m benchmarks.speed.swap

# ViT-S/B stock, fused SDPA and NaLa at 512..4096.
vit-bench: setup
	$(PY) -m benchmarks.speed.vit

# SETR ViT-L whole vs sliding-window inference at Cityscapes' size.
vit-cityscapes-bench: setup
	$(PY) -m benchmarks.speed.vit_cityscapes

# ViTDet-B: windows, global softmax and NaLa, backbone + SimpleFPN and the whole Mask R-CNN.
vitdet-bench: setup
	$(PY) -m benchmarks.speed.vitdet

# torch.compile: graphs over the sizes users meet; compiled against eager for the NaLa layer,
# NaLaFormer-T vs Swin-T, NaLa ViT vs fused SDPA and the UperNets (compile time apart).
compile-bench: setup
	$(PY) -m benchmarks.speed.compile

# bf16 autocast against fp32, a training step of the demo segmentor.
amp-bench: setup
	$(PY) -m benchmarks.speed.amp

# The block's conv weight gradients: oneDNN against nala_mm.ops.conv_weight_grad.
conv-bench: setup
	$(PY) -m benchmarks.speed.conv_weight_grad

# ONNX Runtime against PyTorch eager, and what torch.compile's capture makes of the model.
deploy-bench: setup
	$(PY) -m benchmarks.speed.deploy

# Token mixers at equal budget on the embedded data: 5 variants x 3 seeds x 200 iterations.
ablation: setup
	$(PY) -m benchmarks.studies.ablation

# Detection demo with / without the per-output LayerNorms, and a ResNet-18 (3 runs of 10 epochs).
out-norm-study: setup
	$(PY) -m benchmarks.studies.out_norm_study

# A trained Swin's stages 1-2 swapped to NaLa and fine-tuned vs softmax continued, 3 seeds.
swap-study: setup
	$(PY) -m benchmarks.studies.swap_finetune

# A softmax-trained Swin (demo data) and ViT (long-range task) converted to NaLa by a plain swap
# or by attention transfer (tools/linearize.py), then fine-tuned, against softmax continued.
linearize: setup
	$(PY) -m benchmarks.studies.linearize

# The attention transfer's design choices on the Swin teacher (target, inputs, parameters, lr).
linearize-choices: setup
	$(PY) -m benchmarks.studies.linearize_choices

# The ViT teacher's zero-shot mIoU against the transfer's iterations.
linearize-iterations: setup
	$(PY) -m benchmarks.studies.linearize_iterations

# A tiny stock-layout ViTDet (generated COCO data) into NaLa in every block: zero-shot bbox mAP
# of the plain swap and of 800 transfer iterations, 3 seeds.
linearize-vitdet: setup
	$(PY) -m benchmarks.studies.linearize_vitdet

# Both demos in full (tools/demo.py), their summaries committed with the commit that trained them.
demo-results: setup
	$(PY) -m benchmarks.studies.demos

# Nine token mixers x three seeds on the long-range task, with the attention statistics
# (one thread per run).
longrange: setup
	$(PY) -m projects.longrange.study

# The claim, graded: the pre-registered plan's ~180 runs, two at a time, resumable (~3 h here;
# stop any time, commit projects/longrange/results/longrange_graded*, run again to go on).
longrange-graded: setup
	$(PY) -m projects.longrange.graded

# A tool's committed output: the variants' parameters and GFLOPs (docs/fidelity.md).
flops-table: setup
	$(PY) tools/get_flops.py --variants > benchmarks/results/tools/flops_variants.md

# The long-range exemplar task's data (ADE20K layout under data/longrange, deterministic).
longrange-data: setup
	$(PY) -m projects.longrange.data

# The sdist and, built from it, the wheel (both carry nala_mm/.mim: configs, tools, model index).
dist: setup
	rm -rf dist build
	$(PY) -m build --no-isolation --outdir dist .

clean-demo:
	rm -rf data/demo work_dirs/demo*
