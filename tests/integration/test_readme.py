"""The README's library example runs as written (docs that rot are worse than none)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_library_example_runs(tmp_path: Path) -> None:
    text = README.read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    example = next(b for b in blocks if "from shadowpoint.hooks import Checkpoints" in b)
    script = tmp_path / "example.py"
    script.write_text(example)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['app.py', 'notes.md']", (out.stdout, out.stderr[-2000:])
