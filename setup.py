"""nala-mm: NaLaFormer (norm-aware linear attention) for MMSegmentation 1.x and MMDetection 3.x."""
from setuptools import find_packages, setup

setup(
    name='nala-mm',
    version='0.1.0',
    description='NaLaFormer backbones and norm-aware linear attention for OpenMMLab '
                '(mmsegmentation 1.x, mmdet 3.x)',
    long_description=open('README.md', encoding='utf-8').read(),
    long_description_content_type='text/markdown',
    packages=find_packages(include=['nala_mm', 'nala_mm.*']),
    python_requires='>=3.9',
    # mmcv is deliberately not listed: pip would build it from source *without* its compiled
    # ops (RoIAlign, NMS). Install it with `make setup` or as the README explains.
    install_requires=[
        'torch>=2.4',  # torch.serialization.add_safe_globals (weights-only Runner checkpoints)
        'mmengine==0.10.7',
        'mmsegmentation==1.2.2',
        'mmdet==3.3.0',
        'einops',
        'numpy<2.3',
        'ftfy',
        'regex',
        'pycocotools',
        'matplotlib',
        'tqdm',
    ],
    extras_require={'tests': ['pytest', 'hypothesis'],
                    # tools/export_onnx.py and benchmarks/deploy.py
                    'deploy': ['onnx', 'onnxruntime', 'onnxscript']},
    license='Apache-2.0',
)
