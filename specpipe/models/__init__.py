"""The model files: the packaged GGUFs (PyPI wheels, pinned by sha256), their install and their one-time
conversion into a local model folder (packaged.py). Below the engine, which loads what it prepares."""
