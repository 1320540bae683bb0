"""README.md as a new user reads it: every ```python block runs as pasted (a fresh interpreter in an empty folder,
nothing defined beforehand, exit 0, nothing on stderr), its excerpt of the main job ends with the job's last
lines, its two commands are the ones CI runs, and its package lists are the ones
scripts/install-deps.sh installs. CPU only, a few seconds."""
import os
import re
import subprocess
import sys

import fp4lab  # the package under test: the blocks run against this copy (PYTHONPATH below)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
README = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()


def python_blocks():
    return re.findall(r"^```python\n(.*?)^```", README, flags=re.S | re.M)


def test_readme_has_python_examples():
    assert python_blocks(), "README.md has no ```python block"


def test_every_python_block_runs_as_pasted(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(fp4lab.__file__))))
    for i, code in enumerate(python_blocks()):
        r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0 and not r.stderr, f"README.md python block {i + 1}:\n{code}\nstderr:\n{r.stderr}"


def test_command_one_ends_as_readme_says():
    """The excerpt under "What the main job prints" ends, after its last `...`, with the main job's last lines."""
    shown = re.search(r"^## What the main job prints\n.*?^```\n(.*?)^```", README, flags=re.S | re.M)
    assert shown, "README.md shows no output of the main job"
    lines = shown.group(1).rstrip("\n").split("\n")
    want = lines[len(lines) - lines[::-1].index("..."):]
    assert len(want) >= 3, want
    r = subprocess.run([os.environ["FP4LAB_BIN"]], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.rstrip("\n").split("\n")[-len(want):] == want


def test_command_two_is_what_ci_runs():
    ci = open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8").read().strip().splitlines()[-1]
    assert ci == "scripts/install-deps.sh && scripts/test.sh"
    assert "\n" + ci + "\n" in README


def test_command_two_ends_as_readme_says():
    """The lines README shows at the end of command 2 are what scripts/test.sh prints last, in order: its summary's
    `grep -E` patterns and `echo` lines (README's N, S, C, B stand for numbers, the script's $variables too)."""
    shown = re.search(r"runs every test, and ends with:\n```\n(.*?)^```", README, flags=re.S | re.M)
    assert shown, "README.md does not show how command 2 ends"
    lines = [re.sub(r"\b[NSCB]\b", "7", line) for line in shown.group(1).rstrip("\n").split("\n")]
    script = open(os.path.join(ROOT, "scripts", "test.sh"), encoding="utf-8").read()
    printed = []  # a regex per line the summary prints
    for line in script[script.rindex('echo "== summary =="'):].splitlines()[1:]:
        if line.startswith("grep -E '"):
            printed.append(line.split("'")[1])
        elif line.startswith('echo "'):
            printed.append("^" + re.sub(r"\\\$\w+", "[0-9]+", re.escape(line[len('echo "'):line.rindex('"')])) + "$")
    assert len(printed) == len(lines) == 3, (printed, lines)
    for want, line in zip(printed, lines):
        assert re.search(want, line), f"README.md shows {line!r}; scripts/test.sh prints lines matching {want!r}"


def script_array(text, name):
    code = "\n".join(line.split("#")[0] for line in text.splitlines())  # comments may hold parentheses
    return re.search(name + r"=\((.*?)\)", code, flags=re.S).group(1).split()


def readme_list(label):
    m = re.search(r"^- " + label + r": (.*)$", README, flags=re.M)
    assert m, f"README.md has no line '- {label}: ...'"
    return re.findall(r"`([^`]+)`", m.group(1))


def test_package_lists_match_install_deps():
    script = open(os.path.join(ROOT, "scripts", "install-deps.sh"), encoding="utf-8").read()
    assert readme_list("Debian packages") == script_array(script, "APT_PACKAGES")
    # module:requirement entries install the requirement; the README names what pip installs
    assert readme_list("Python packages") == [p.split(":")[-1] for p in script_array(script, "PY_PACKAGES")]


def test_cli_guide_lists_the_knobs_readme_lists():
    # README's list is held to the parsers' tables by tests/cli/cli_test.cpp; docs/cli.md restates it
    knobs = re.search(r"every knob is also settable on\s+its own: (.*?)\.\n", README, flags=re.S)
    assert knobs, "README.md lists no knobs"
    guide = " ".join(open(os.path.join(ROOT, "docs", "cli.md"), encoding="utf-8").read().split())
    missing = [k for k in re.findall(r"`([^`]+)`", knobs.group(1)) if f"`{k}`" not in guide]
    assert not missing, f"knobs README.md lists and docs/cli.md does not: {missing}"


def test_readme_is_under_150_lines():
    # the front page: what fp4lab is, the two commands, where to go next; the rest lives in docs/ (docs/index.md)
    assert len(README.splitlines()) < 150
