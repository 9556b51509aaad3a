"""Loaded by every process of the scale harness (bench/scale/cluster.py puts this folder on
PYTHONPATH): the shared virtual environment's editable install maps the product's packages
to another checkout, and its finder answers for any module this checkout lacks (a module
added there since), so a process here could import half its code from elsewhere. The
harness measures this checkout alone: that finder is taken off the import path."""

import sys

sys.meta_path[:] = [finder for finder in sys.meta_path
                    if not getattr(finder, "__module__", "").startswith("__editable__")]
