"""The README's "From Python" example, run as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from conftest import ROOT


def readme_example() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## From Python\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readmes_python_example_prints_the_sum():
    # No provider in the environment: the scripted model answers.
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and not k.startswith("TILLER_")}
    done = subprocess.run([sys.executable, "-c", readme_example()], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "[add: 1913.4]\nThe sum is 1913.4.\n"
