"""Loading the project's scripts (workflow/scripts/, bench/: files, not packages) as modules, so that tests can call
their functions."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_script(relative_path: str, module_name: str | None = None):
    """The script at ROOT / relative_path, executed as a module of its own."""
    path = ROOT / relative_path
    spec = importlib.util.spec_from_file_location(module_name or f"script_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
