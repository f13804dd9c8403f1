"""What the tools call, for code that does the same: :mod:`.config_loading` and
:mod:`.config_path` (find, load and build a config's model), :mod:`.compile` (compiled training
and inference at changing sizes), :mod:`.linearize` (attention transfer from softmax weights),
:mod:`.export` (ONNX), :mod:`.data_samples` (a synthetic batch for a config's task).

Each module is imported on use (``from nala_mm.apis.compile import compile_model``):
``import nala_mm`` registers the models and loads none of these.
"""
