"""python3 -m fp4lab_lab.sr_draw_check: the paired comparison of training runs under two SR draws
(docs/spec.md §4) pairs each seed's philox4 run with its philox1 run, computes the differences and their t-interval
from the runs' own losses, and refuses runs that cannot be paired."""
import json

import pytest

from fp4lab._files import DataError
from fp4lab_lab import sr_draw_check  # lab/ on PYTHONPATH (tests/python/CMakeLists.txt)


def run(seed, draw, val, train_tail, steps=20, recipe="ufp4"):
    """A fp4lab-train run JSON with the fields the check reads; its last 10% of steps (2 of 20) at train_tail."""
    train = [3.0] * (steps - 2) + [train_tail] * 2
    return {"name": f"test-{recipe}-exact-s{seed}-{steps}-{draw}", "recipe": recipe, "gemm_mode": "exact",
            "model": "test", "corpus": "python-doc", "seed": seed, "sr_draw": draw, "params": 1000,
            "block_params": 800, "tokens_per_s": 1.0, "steps": list(range(1, steps + 1)), "train_loss": train,
            "val_steps": [steps], "val_loss": [val], "diverged": None, "deterministic": False,
            "config": {"d": 64, "layers": 2, "seq": 128, "batch": 16, "steps": steps}}


def write(tmp_path, runs):
    paths = []
    for r in runs:
        p = tmp_path / f"s{r['seed']}-{r['sr_draw']}-{r['recipe']}.json"
        p.write_text(json.dumps(r))
        paths.append(str(p))
    return paths


def check(tmp_path, runs):
    """The check's JSON for these runs (written to files), asserting it exits 0."""
    out = tmp_path / "check.json"
    assert sr_draw_check.main(write(tmp_path, runs) + ["--json", str(out)]) == 0
    return json.load(open(out))


def test_pairs_by_seed_and_reports_the_t_interval(tmp_path, capsys):
    # Differences philox4 - philox1: +0.1, -0.1, +0.3 (validation); mean 0.1, SD 0.2, t(2 df) 4.302653.
    runs = [run(0, "philox1", 2.0, 2.5), run(0, "philox4", 2.1, 2.5), run(1, "philox1", 2.0, 2.5),
            run(1, "philox4", 1.9, 2.5), run(2, "philox1", 2.0, 2.5), run(2, "philox4", 2.3, 2.5)]
    got = check(tmp_path, runs)
    assert got["seeds"] == [0, 1, 2]
    assert got["val"]["diffs"] == pytest.approx([0.1, -0.1, 0.3])
    assert got["val"]["mean"] == pytest.approx(0.1) and got["val"]["sd"] == pytest.approx(0.2)
    half = 4.302653 * 0.2 / 3 ** 0.5
    assert got["val"]["low"] == pytest.approx(0.1 - half, abs=1e-6)
    assert got["val"]["verdict"] == "no difference detectable"
    assert got["train"]["diffs"] == [0.0, 0.0, 0.0]  # the last 10% of the training losses, equal here
    assert "philox4 - philox1, paired by seed" in capsys.readouterr().out


def test_runs_that_cannot_be_paired_are_refused(tmp_path):
    one_seed = [run(0, "philox1", 2.0, 2.5), run(0, "philox4", 2.1, 2.5)]
    with pytest.raises(DataError, match=r"fewer than two seeds .* \(unpaired: seed 1 \(philox1\)\)"):
        sr_draw_check.main(write(tmp_path, one_seed + [run(1, "philox1", 2.0, 2.5)]))
    mixed = one_seed + [run(1, "philox1", 2.0, 2.5), run(1, "philox4", 2.1, 2.5, recipe="nvfp4")]
    with pytest.raises(DataError, match="differ in more than seed and SR draw"):
        sr_draw_check.main(write(tmp_path, mixed))
    other = one_seed + [run(1, "philox1", 2.0, 2.5), run(1, "philox4", 2.1, 2.5)]
    other[3]["config"]["batch"] = 32  # another batch size: another experiment
    with pytest.raises(DataError, match="differ in more than seed and SR draw"):
        sr_draw_check.main(write(tmp_path, other))
    twice = one_seed + [run(1, "philox1", 2.0, 2.5), run(1, "philox4", 2.1, 2.5)]
    paths = write(tmp_path, twice)
    with pytest.raises(DataError, match="a second run of seed 0 under philox1"):
        sr_draw_check.main(paths + [paths[0]])
    (tmp_path / "junk.json").write_text("[1, 2]")
    with pytest.raises(DataError, match="junk.json: no run name"):
        sr_draw_check.main(paths + [str(tmp_path / "junk.json")])


def test_the_later_draw_is_compared_with_the_earlier_and_three_draws_are_refused(tmp_path, capsys):
    # philox16 beside philox4, given in either order: the differences are philox16 - philox4 (+0.2, +0.1, 0.0).
    runs = [run(0, "philox16", 2.2, 2.5), run(0, "philox4", 2.0, 2.5), run(1, "philox4", 2.0, 2.5),
            run(1, "philox16", 2.1, 2.5), run(2, "philox16", 2.0, 2.5), run(2, "philox4", 2.0, 2.5)]
    got = check(tmp_path, runs)
    assert (got["new"], got["base"]) == ("philox16", "philox4")
    assert got["val"]["diffs"] == pytest.approx([0.2, 0.1, 0.0])
    assert got["val"]["philox4"] == [2.0, 2.0, 2.0]
    assert "philox16 - philox4, paired by seed" in capsys.readouterr().out
    third = runs + [run(0, "philox1", 2.0, 2.5)]
    with pytest.raises(DataError, match=r"under 3 SR draw\(s\) \(philox1, philox4, philox16\): a check pairs two"):
        sr_draw_check.main(write(tmp_path, third))
