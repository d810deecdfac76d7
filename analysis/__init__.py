"""Measurement and analysis: timing harness, FLOP model, provenance, experiments, tables, figures, report.

Importing it checks that ``import kernels`` finds this project's kernels (the folder beside this one, as
the repository, an editable install and a wheel all lay them out): PyPI's ``kernels`` is an unrelated
package, and with it first on the path every family would fail with an unhelpful ``No module named
'kernels.attention'``.
"""

import importlib.util as _util
import sys as _sys
from pathlib import Path as _Path


def _check_kernels() -> None:
    ours = _Path(__file__).resolve().parent.parent / "kernels"
    module = _sys.modules.get("kernels")
    spec = getattr(module, "__spec__", None) if module is not None else _util.find_spec("kernels")
    if spec is None:  # not there at all: what needs it says so when it imports it
        return
    where = spec.origin or next(iter(spec.submodule_search_locations or ()), None)
    if where is None or _Path(where).resolve() != ours / "__init__.py":
        raise ImportError(
            f"`import kernels` finds {where}, not this project's {ours}: another package named kernels comes "
            "first (PyPI's `kernels` is Hugging Face's, unrelated to this project). Uninstall it "
            f"(pip uninstall kernels), use an environment without it, or put this project first: "
            f"PYTHONPATH={ours.parent}"
        )


_check_kernels()
