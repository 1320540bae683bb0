"""fp4lab-train (fp4lab.study) and the lab's study commands (lab/fp4lab_lab/study) against hostile input: a
checkpoint is loaded without running any of its code; every option, input and output is checked before the first
training step; each fault is one line `fp4lab-train CMD: error: ...` (the lab's: `python3 -m fp4lab_lab.study CMD:
error: ...`) with the documented exit code (docs/spec.md §11.1: 1 data, 2 usage); outputs are written under
the command line's rules. Most cases end before any training, so they run in-process and fast."""
import io
import json
import os
import shlex
import subprocess
import sys
import tarfile

import pytest

torch = pytest.importorskip("torch")

import fp4lab  # noqa: E402
from fp4lab.study import cli  # noqa: E402
from fp4lab_lab import study as lab_study  # noqa: E402  (lab/ on PYTHONPATH: tests/python/CMakeLists.txt)
from fp4lab_lab.study import tiny_lm  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
PKG = os.path.dirname(os.path.abspath(fp4lab.__file__))
EXIT_DATA, EXIT_USAGE, EXIT_CONTINUE = 1, 2, 75  # docs/spec.md §11.1; 75: stopped with its state saved

TEXT = (b"The kernel boots and the driver binds to a device. Memory barriers order accesses; files have inodes, "
        b"and patches go to the list. ")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A training-data folder (train.bin, val.bin), just big enough for the cases below."""
    d = tmp_path_factory.mktemp("data")
    (d / "train.bin").write_bytes(TEXT * 80)  # 100 × (sequence + 1) bytes at least, for sequences up to 63
    (d / "val.bin").write_bytes(TEXT[::-1] * 6)
    return d


def tiny(data, *extra):
    """`train` on the smallest run the study allows: the test model, 10 steps of one 16-token sequence."""
    return ["train", "--data", str(data), "--size", "test", "--recipe", "ufp4", "--steps", "10", "--batch", "1",
            "--seq", "16", "--eval-windows", "1", "--eval-every", "10", "--log-every", "10", "--device", "cpu",
            *extra]


def run(capsys, argv, main=cli.main):
    """The console script in-process: (exit code, stdout, stderr)."""
    try:
        rc = main(list(argv))
    except SystemExit as e:  # the old way out: a message as the code, which is no exit code
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def one_line(err, cmd="train", prog="fp4lab-train"):
    assert err.startswith(f"{prog} {cmd}: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


# ---------------------------------------------------------------------------------------------------------
# Code execution from a checkpoint
# ---------------------------------------------------------------------------------------------------------

class _Payload:
    """Unpickled, it runs a shell command that creates the marker file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(self.marker)}",)


def test_checkpoint_that_would_run_code_is_refused_without_running_it(data, tmp_path):
    marker = tmp_path / "ran"
    ck = tmp_path / "ck.pt"
    torch.save({"key": _Payload(str(marker)), "step": 1}, ck)
    before = ck.read_bytes()
    out = tmp_path / "o.json"
    r = subprocess.run([sys.executable, "-m", "fp4lab.study", *tiny(data, "--checkpoint", str(ck), "--out", str(out))],
                       capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert not marker.exists(), "loading the checkpoint ran its code"
    assert r.returncode == EXIT_DATA, r.stderr
    assert str(ck) in one_line(r.stderr) and "not a checkpoint" in r.stderr
    assert r.stdout == "" and not out.exists() and ck.read_bytes() == before


def test_no_load_in_the_project_can_run_code():
    # Every torch.load of the package, its scripts and the lab takes weights_only=True; nothing unpickles otherwise.
    found = []
    for top in (PKG, os.path.join(ROOT, "scripts"), os.path.join(ROOT, "lab")):
        for dp, _, fns in os.walk(top, followlinks=True):
            for fn in fns:
                if fn.endswith(".py"):
                    text = open(os.path.join(dp, fn), encoding="utf-8").read()
                    calls = text.split("torch.load(")[1:]
                    found += [(fn, c[:120]) for c in calls if "weights_only=True" not in c.split("\n\n")[0][:300]]
                    found += [(fn, bad) for bad in ("weights_only=False", "pickle.load", "allow_pickle=True")
                              if bad in text]
    assert found == []


@pytest.fixture(scope="module")
def stopped(data, tmp_path_factory):
    """A run stopped after step 5 (--stop-at): its checkpoint's bytes."""
    d = tmp_path_factory.mktemp("stopped")
    ck = d / "ck.pt"
    try:
        rc = cli.main(tiny(data, "--checkpoint", str(ck), "--stop-at", "5"))
    except SystemExit as e:
        rc = e.code
    assert rc == EXIT_CONTINUE and sorted(os.listdir(d)) == ["ck.pt"]
    return ck.read_bytes()


def test_checkpoint_loads_as_weights_only_and_resumes(data, stopped, tmp_path, capsys):
    # What the study saves is tensors, numbers, strings, lists and dicts: torch.load(weights_only=True) reads it.
    ck = torch.load(io.BytesIO(stopped), weights_only=True)
    assert ck["step"] == 5 and ck["rng"].dtype == torch.uint8 and ck["losses"].shape == (5,)
    (tmp_path / "ck.pt").write_bytes(stopped)
    rc, out, err = run(capsys, tiny(data, "--checkpoint", str(tmp_path / "ck.pt"), "--out", str(tmp_path / "p.json")))
    assert rc == 0 and "resumed at step 5" in out, err
    rc, _, err = run(capsys, tiny(data, "--out", str(tmp_path / "w.json")))
    assert rc == 0, err
    parts, whole = (json.load(open(tmp_path / f)) for f in ("p.json", "w.json"))
    assert parts["train_loss"] == whole["train_loss"] and parts["val_loss"] == whole["val_loss"]
    assert sorted(os.listdir(tmp_path)) == ["p.json", "w.json"]  # the checkpoint removed, no temporary left


def _torch_bytes(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


CHECKPOINTS = {
    "random": lambda ok: os.urandom(4096),
    "empty": lambda ok: b"",
    "truncated": lambda ok: ok[: len(ok) // 2],
    "empty dict": lambda ok: _torch_bytes({}),
    "list": lambda ok: _torch_bytes([1, 2, 3]),
    "json": lambda ok: b'{"key": {}}',
    "fields of the wrong type": lambda ok: _torch_bytes({**torch.load(io.BytesIO(ok), weights_only=True),
                                                         "step": "5"}),
    "step past the run": lambda ok: _torch_bytes({**torch.load(io.BytesIO(ok), weights_only=True), "step": 50}),
    "model of another shape": lambda ok: _torch_bytes({**torch.load(io.BytesIO(ok), weights_only=True),
                                                       "model": {"emb.weight": torch.zeros(3)}}),
    "optimizer state of another shape": lambda ok: _torch_bytes(_moments_of_shape(
        torch.load(io.BytesIO(ok), weights_only=True), (3,))),
}


def _moments_of_shape(ck, shape):
    for state in ck["opt"]["state"].values():
        state["exp_avg"] = torch.zeros(shape)
    return ck


@pytest.mark.parametrize("kind", list(CHECKPOINTS))
def test_bad_checkpoint_is_one_line_data_error(data, stopped, tmp_path, capsys, kind):
    ck = tmp_path / "ck.pt"
    ck.write_bytes(CHECKPOINTS[kind](stopped))
    before = ck.read_bytes()
    rc, out, err = run(capsys, tiny(data, "--checkpoint", str(ck), "--out", str(tmp_path / "o.json")))
    assert rc == EXIT_DATA and str(ck) in one_line(err), err
    assert out == "" and ck.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["ck.pt"]


# ---------------------------------------------------------------------------------------------------------
# Arguments and outputs: refused before any work
# ---------------------------------------------------------------------------------------------------------

USAGE = [
    (["--batch", "0"], "--batch 0"),
    (["--batch", "-1"], "--batch -1"),
    (["--seq", "0"], "--seq 0"),
    (["--lr", "nan"], "--lr nan"),
    (["--lr", "inf"], "--lr inf"),
    (["--lr", "0"], "--lr 0"),
    (["--device", "bogus"], "--device 'bogus'"),
    (["--device", "cuda:99"], "--device cuda:99"),
    (["--device", "meta"], "--device meta"),
    (["--batch", "4", "--eval-windows", "1", "--eval-every", "5"], "--eval-windows 1"),
    (["--eval-windows", "0"], "--eval-windows 0"),
    (["--seed", "-1"], "--seed -1"),
    (["--seed", str(2**64)], "--seed"),
    (["--steps", "9"], "--steps 9"),
    (["--steps", "-10"], "--steps -10"),
    (["--eval-every", "0"], "--eval-every 0"),
    (["--log-every", "-5"], "--log-every -5"),
    (["--concurrent", "0"], "--concurrent 0"),
    (["--checkpoint", "{tmp}/ck.pt", "--time-limit", "nan"], "--time-limit"),
    (["--checkpoint", "{tmp}/ck.pt", "--stop-at", "10"], "--stop-at"),
    (["--capture-steps", "x"], "--capture-steps 'x'"),
    (["--capture-steps", "-1"], "--capture-steps '-1'"),
    (["--capture-steps", ""], "--capture-steps ''"),
    (["--capture-steps", "10"], "--capture-steps '10'"),  # past the last step: nothing would be captured
    (["--capture-steps", "3"], "--capture-steps 3"),  # 16 token rows a step, fewer than a record's 128
    (["--capture-steps", "3", "--capture-pattern", "("], "--capture-pattern '('"),
    (["--capture-steps", "3", "--capture-pattern", "^nothing$"], "--capture-pattern '^nothing$'"),
    (["--capture-steps", "3", "--capture-tokens", "0"], "--capture-tokens 0"),
    (["--capture-steps", "3", "--capture-tokens", "5"], "--capture-tokens 5"),
    (["--capture-steps", "3", "--capture-token-stride", "0"], "--capture-token-stride 0"),
    (["--capture-steps", "3", "--capture-max-out", "7"], "--capture-max-out 7"),
    (["--capture-steps", "3", "--capture-max-out", "-16"], "--capture-max-out -16"),
    (["--out", "{data}/train.bin"], "output is also an input"),
    (["--checkpoint", "{data}/val.bin"], "output is also an input"),
    (["--out", "{tmp}/a.json", "--checkpoint", "{tmp}/a.json"], "two outputs"),
    (["--size", "huge"], "--size"),
    (["--ste", "5"], "--ste"),  # no prefix guessing: not --steps
    (["--bogus"], "--bogus"),
]

DATA = [
    (["--out", "{tmp}", "--force"], "not a regular file"),  # a folder
    (["--out", "/dev/full"], "not a regular file"),
    (["--out", "{tmp}/missing/o.json"], "no such folder"),
    (["--out", "{tmp}/file/o.json"], "{tmp}/file/o.json"),  # its folder is a file
    (["--checkpoint", "{tmp}"], "a folder"),
    (["--checkpoint", "{tmp}/missing/ck.pt", "--stop-at", "5"], "no such folder"),
    (["--capture-steps", "3", "--capture-dir", "{tmp}/file"], "not a folder"),
    (["--data", "{tmp}/missing"], "{tmp}/missing"),
    (["--data", "{tmp}/small"], "too little text"),
    (["--data", "{tmp}/badmeta"], "corpus.json"),
]


def _fill(args, data, tmp):
    return [a.format(data=data, tmp=tmp) for a in args]


@pytest.fixture
def place(tmp_path):
    (tmp_path / "file").write_text("a file, not a folder\n")
    (tmp_path / "small").mkdir()
    (tmp_path / "small" / "train.bin").write_bytes(TEXT)
    (tmp_path / "small" / "val.bin").write_bytes(TEXT)
    (tmp_path / "badmeta").mkdir()
    for f in ("train.bin", "val.bin"):
        (tmp_path / "badmeta" / f).write_bytes(TEXT * 80)
    (tmp_path / "badmeta" / "corpus.json").write_text("[1, 2]")
    return tmp_path


def _listing(root):
    return sorted(os.path.relpath(os.path.join(dp, f), root) for dp, _, fns in os.walk(root) for f in fns)


@pytest.mark.parametrize("args,fault", USAGE + DATA, ids=[" ".join(a) for a, _ in USAGE + DATA])
def test_bad_argument_or_output_is_refused_before_any_work(data, place, capsys, args, fault):
    before, data_before = _listing(place), _listing(data)
    argv = _fill(args, data, place)
    rc, out, err = run(capsys, tiny(data, *argv))
    assert rc == (EXIT_USAGE if (args, fault) in USAGE else EXIT_DATA), err
    assert fault.format(data=data, tmp=place) in one_line(err), err
    assert out == ""  # not one step ran
    assert _listing(place) == before and _listing(data) == data_before  # nothing written, no temporary


def test_out_is_checked_before_training_and_written_atomically(data, place, capsys):
    # A folder named as --out is found at the start (the issue: after the whole run, with a traceback); a good
    # --out gets the JSON and nothing else, and an existing one is replaced only with --force.
    rc, out, err = run(capsys, tiny(data, "--out", str(place), "--force"))
    assert rc == EXIT_DATA and out == "" and "not a regular file" in one_line(err)
    dest = place / "runs"
    dest.mkdir()
    rc, _, err = run(capsys, tiny(data, "--out", str(dest / "r.json")))
    assert rc == 0, err
    assert os.listdir(dest) == ["r.json"] and json.load(open(dest / "r.json"))["steps"] == list(range(1, 11))
    rc, out, err = run(capsys, tiny(data, "--out", str(dest / "r.json")))
    assert rc == EXIT_DATA and out == "" and "exists (--force to replace)" in one_line(err)


# ---------------------------------------------------------------------------------------------------------
# corpus: damaged packages
# ---------------------------------------------------------------------------------------------------------

def _ar(members):
    """An ar archive (a Debian package's container) of (name, bytes) members."""
    out = b"!<arch>\n"
    for name, body in members:
        out += f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(body):<10}`\n".encode() + body + b"\n" * (len(body) & 1)
    return out


def _data_tar(mode):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tar:
        for rel, text in (("a.rst.txt", TEXT * 20), ("b.rst.txt", TEXT * 30)):
            info = tarfile.TarInfo(f"./usr/share/doc/linux-doc-9.9/html/_sources/{rel}")
            info.size = len(text)
            tar.addfile(info, io.BytesIO(text))
    return buf.getvalue()


def _deb(member, body):
    return _ar([("debian-binary", b"2.0\n"), ("control.tar.xz", b""), (member, body)])


DEBS = {
    "data.tar.xz of random bytes": lambda: _deb("data.tar.xz", os.urandom(3000)),
    "truncated data.tar.xz": lambda: _deb("data.tar.xz", (lambda b: b[: len(b) // 2])(_data_tar("w:xz"))),
    "truncated data.tar": lambda: _deb("data.tar", _data_tar("w")[:1500]),
    "data.tar.gz damaged inside": lambda: _deb("data.tar.gz", (lambda b: b[:40] + bytes(60) + b[100:])(
        _data_tar("w:gz"))),
    "data.tar.bz2 of zeros": lambda: _deb("data.tar.bz2", b"BZh9" + bytes(200)),
    "negative member size": lambda: _ar([("debian-binary", b"2.0\n")]).replace(b"4         `", b"-4        `"),
    "member past the end": lambda: _deb("data.tar.xz", _data_tar("w:xz"))[:-100],
}


def test_corpus_of_a_good_package(tmp_path, capsys):
    # The package the damaged ones below are made from is read (so their faults are the damage, not the maker).
    deb = tmp_path / "linux-doc-9.9_9.9-1_all.deb"
    deb.write_bytes(_deb("data.tar.xz", _data_tar("w:xz")))
    rc, _, err = run(capsys, ["corpus", "--deb", str(deb), str(tmp_path / "out")], lab_study.main)
    assert rc == 0, err
    assert sorted(os.listdir(tmp_path / "out")) == ["corpus.json", "train.bin", "val.bin"]


@pytest.mark.parametrize("kind", list(DEBS))
def test_damaged_package_is_one_line_data_error(tmp_path, capsys, kind):
    deb = tmp_path / "linux-doc-9.9_9.9-1_all.deb"
    deb.write_bytes(DEBS[kind]())
    rc, out, err = run(capsys, ["corpus", "--deb", str(deb), str(tmp_path / "out")], lab_study.main)
    assert rc == EXIT_DATA and str(deb) in one_line(err, "corpus", lab_study.PROG), err
    assert not (tmp_path / "out").exists() and os.listdir(tmp_path) == [deb.name]


@pytest.mark.parametrize("where,fault", [("deb-folder", "a folder"), ("out-file", "not a folder")])
def test_corpus_paths_checked_first(tmp_path, capsys, where, fault):
    deb = tmp_path / "linux-doc-9.9_9.9-1_all.deb"
    out = tmp_path / "out"
    if where == "deb-folder":
        deb.mkdir()
    else:
        deb.write_bytes(_deb("data.tar.xz", _data_tar("w:xz")))
        out.write_text("a file\n")
    rc, _, err = run(capsys, ["corpus", "--deb", str(deb), str(out)], lab_study.main)
    assert rc == EXIT_DATA and fault in one_line(err, "corpus", lab_study.PROG), err


# ---------------------------------------------------------------------------------------------------------
# report --merge into a JSON that is no report, run files that are no runs
# ---------------------------------------------------------------------------------------------------------

REPORTS = {
    "runs not a list": '{"runs": 5}',
    "a run not an object": '{"runs": [1]}',
    "a run without its fields": '{"runs": [{"name": "x"}]}',
    "a run of an unknown size": '{"runs": [{"name": "x", "model": "huge"}]}',
    "an analysis": '{"gemms": []}',
}


@pytest.mark.parametrize("kind", list(REPORTS))
def test_report_merge_into_a_non_report_is_refused(tmp_path, capsys, kind):
    j = tmp_path / "training.json"
    j.write_text(REPORTS[kind])
    rc, out, err = run(capsys, ["report", "--merge", "--json", str(j), "--doc", "", "--figures", ""])
    assert rc == EXIT_DATA and str(j) in one_line(err, "report"), err
    assert j.read_text() == REPORTS[kind] and os.listdir(tmp_path) == ["training.json"]


def test_report_run_file_without_its_fields_or_as_output(tmp_path, capsys):
    run_file = tmp_path / "r.json"
    run_file.write_text('{"name": "r", "model": "test"}')
    rc, _, err = run(capsys, ["report", str(run_file), "--json", str(tmp_path / "t.json"), "--doc", "",
                              "--figures", ""])
    assert rc == EXIT_DATA and str(run_file) in one_line(err, "report"), err
    rc, _, err = run(capsys, ["report", str(run_file), "--json", str(run_file), "--doc", "", "--figures", ""])
    assert rc in (EXIT_DATA, EXIT_USAGE) and str(run_file) in one_line(err, "report"), err
    assert os.listdir(tmp_path) == ["r.json"] and run_file.read_text() == '{"name": "r", "model": "test"}'


# ---------------------------------------------------------------------------------------------------------
# The console script's ending, and no SystemExit from the library
# ---------------------------------------------------------------------------------------------------------

def test_stdout_on_a_full_device_or_a_closed_pipe():
    cmd = [sys.executable, "-m", "fp4lab.study", "recipes"]
    with open("/dev/full", "w") as full:
        r = subprocess.run(cmd, stdout=full, stderr=subprocess.PIPE, text=True)
    assert r.returncode == EXIT_DATA and r.stderr.startswith("fp4lab-train recipes: error: ")
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # the reader is gone before the first line
    err = p.stderr.read()
    assert p.wait() == -13 and err == b""  # ended by SIGPIPE, silently, as the command line


@pytest.mark.parametrize("study", [os.path.join(PKG, "study"), os.path.join(ROOT, "lab", "fp4lab_lab", "study")])
def test_study_library_raises_no_system_exit(study):
    for fn in sorted(os.listdir(study)):
        if fn.endswith(".py") and fn != "__main__.py":
            text = open(os.path.join(study, fn), encoding="utf-8").read()
            assert "SystemExit" not in text, fn
            assert text.count("sys.exit(") == text.count('if __name__ == "__main__":\n    sys.exit(main())'), fn


@pytest.mark.parametrize("argv,code", [
    (["train", "--data", "{tmp}", "--steps", "-1"], EXIT_USAGE),
    (["train", "--data", "{tmp}", "--lr", "nan"], EXIT_USAGE),
    (["train", "--data", "{tmp}", "--val", "nosuchnovel"], EXIT_USAGE),
    (["train", "--data", "{tmp}", "--summary", "{tmp}"], EXIT_DATA),
    (["train", "--data", "{tmp}"], EXIT_DATA),  # no novels there
    (["corpus", "{tmp}/missing.deb", "{tmp}/out"], EXIT_DATA),
])
def test_tiny_lm_faults_are_one_line(tmp_path, capsys, argv, code):
    rc, out, err = run(capsys, [a.format(tmp=tmp_path) for a in argv], main=tiny_lm.main)
    assert rc == code, err
    assert err.startswith("python3 -m fp4lab_lab.study.tiny_lm: error: ") and err.count("\n") == 1, err
