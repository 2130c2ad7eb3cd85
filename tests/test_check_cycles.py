"""scripts/check_cycles.py: the import circles of src/rlvr (none), and what it counts as one."""

import importlib.util
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parent.parent / "scripts" / "check_cycles.py"


def _script():
    spec = importlib.util.spec_from_file_location("check_cycles", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_src_rlvr_has_no_import_circle():
    out = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout
    assert out.stdout.startswith("import circles: 0 ")


def test_module_function_and_type_checking_imports_all_close_circles(tmp_path, capsys):
    files = {
        "__init__.py": "",
        "a.py": "from pkg import b\n",  # module level
        "b.py": "def f():\n    from . import a\n",  # function level, relative
        "c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.d import X\n",
        "d.py": "import pkg.c\nX = 1\n",
        "e.py": "from .e import y\ny = 1\n",  # itself
        "f.py": "from pkg import a, b\n",  # into a circle, not part of one
    }
    (tmp_path / "pkg").mkdir()
    for name, text in files.items():
        (tmp_path / "pkg" / name).write_text(text)
    assert _script().report(tmp_path / "pkg") == 3
    out = capsys.readouterr().out
    assert "circle of 2 files: pkg.a, pkg.b" in out
    assert "pkg.b -> pkg.a (function :2)" in out
    assert "pkg.c -> pkg.d (type-checking :3)" in out
    assert "circle of 1 file: pkg.e" in out
    assert "pkg.f" not in out
    assert out.strip().endswith(
        "(1 with module-level imports only, 2 with module- and function-level ones)"
    )
