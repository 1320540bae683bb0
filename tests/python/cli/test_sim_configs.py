"""The bundled TCU configurations (sim/configs/*.cfg) and what they price: `fp4lab sim --list-configs` lists exactly
those files, `--config NAME` is `--config sim/configs/NAME.cfg` from any folder, the native H200-class design points
take their area from rtl/area.json (the equal-area ones their MAC counts too), and the static energy is leakage per
mm^2 times the built units' area times the run time, worked out here from the configuration values alone.
FP4LAB_BIN names the built command line (ctest sets it)."""
import glob
import json
import math
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BIN = os.environ.get("FP4LAB_BIN", os.path.join(ROOT, "build", "bin", "fp4lab"))
CONFIGS = sorted(os.path.basename(p)[:-4] for p in glob.glob(os.path.join(ROOT, "sim", "configs", "*.cfg")))
NATIVE = ["h200-class-e2m1", "h200-class-e1m2", "h200-class-dual", "h200-class-e1m2-area", "h200-class-dual-area"]
KERNEL = ["--kernel", "mma", "--shape", "256x256x256"]  # a small run every configuration takes


def fp4lab(*args, cwd=ROOT):
    return subprocess.run([BIN, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def sim_json(*args, cwd=ROOT):
    p = fp4lab("sim", *args, "--json", "-", cwd=cwd)
    assert p.returncode == 0, p.stderr
    return p.stdout


def description(name):
    """The first sentence of the file's leading comment block, as --list-configs gives it."""
    words = []
    with open(os.path.join(ROOT, "sim", "configs", name + ".cfg")) as f:
        for line in f:
            if not line.startswith("#") or not line.strip("# \n"):
                break
            words.append(line.strip("# \n"))
    text = " ".join(words)
    end = next((i for i, c in enumerate(text) if c == "." and (i + 1 == len(text) or text[i + 1] == " ")), None)
    return text if end is None else text[: end + 1]


def test_list_configs_names_every_bundled_file_with_its_description():
    p = fp4lab("sim", "--list-configs")
    assert p.returncode == 0, p.stderr
    rows = [line.split(None, 1) for line in p.stdout.splitlines()]
    assert [r[0] for r in rows] == CONFIGS
    for name, desc in rows:
        assert desc == description(name) and desc.endswith("."), name
    assert set(NATIVE) <= set(CONFIGS)


def test_list_configs_runs_nothing_else():
    p = fp4lab("sim", "--list-configs", "--config", "teaching")
    assert p.returncode == 2 and "--list-configs" in p.stderr and p.stdout == ""


@pytest.mark.parametrize("name", CONFIGS)
def test_bundled_config_by_name_is_the_file_byte_for_byte(name, tmp_path):
    by_path = sim_json(*KERNEL, "--config", f"sim/configs/{name}.cfg")
    # By name from a folder without the source tree, as an installed tool runs.
    by_name = sim_json(*KERNEL, "--config", name, cwd=tmp_path)
    j = json.loads(by_name)
    assert j["config"]["name"] == name
    # The report repeats its command line; everything else is the same bytes.
    assert by_name.replace(json.dumps(j["command"]), "CMD") == by_path.replace(
        json.dumps(json.loads(by_path)["command"]), "CMD")


def test_a_file_of_that_name_wins_over_the_bundled_config(tmp_path):
    text = open(os.path.join(ROOT, "sim", "configs", "teaching.cfg")).read()
    (tmp_path / "h100-class").write_text(text)
    j = json.loads(sim_json(*KERNEL, "--config", "h100-class", cwd=tmp_path))
    assert j["config"]["name"] == "teaching"


def nand2(build):
    """NAND2 equivalents of an rtl/area.json build (docs/sim.md): transistors / 4, plus 6 per flip-flop."""
    return build["transistors"] / 4 + 6 * build["ffs"]


def test_native_design_points_take_their_area_from_rtl_area_json():
    builds = json.load(open(os.path.join(ROOT, "rtl", "area.json")))["builds"]
    mac = {k: nand2(builds["mac_" + k]) for k in ("e2m1", "e1m2", "dual")}
    cfg = {n: json.loads(sim_json(*KERNEL, "--config", n))["config"] for n in NATIVE}
    for n, c in cfg.items():
        kind = c["mac.kind"]
        assert n.startswith("h200-class-" + kind)
        for k in mac:
            assert c[f"area.mac_{k}_nand2"] == mac[k], n
        assert c["area.rht_lane_nand2"] == nand2(builds["rht16"]) / 16
        assert c["area.quant_lane_nand2"] == nand2(builds[f"quant_{kind}_ue4m3"]) / 16
        assert c.get("area.acc_lane_nand2", 0) == 0  # inside the block MACs (a key at 0 is left out of reports)
        assert c["acc.lanes"] == c["mac.units"]
        # Equal MAC count, or the most units whose block-MAC area fits in that of 256 E2M1-only units.
        want = math.floor(256 * mac["e2m1"] / mac[kind]) if n.endswith("-area") else 256
        assert c["mac.units"] == want, n
    for kind in ("e1m2", "dual"):  # an equal-area point differs from its equal-count one in its size alone
        a, b = dict(cfg[f"h200-class-{kind}-area"]), dict(cfg[f"h200-class-{kind}"])
        for c in (a, b):
            for k in ("name", "mac.units", "acc.lanes", "acc.fused_lanes"):
                c.pop(k)
        assert a == b
    assert cfg["h200-class-dual-area"]["mac.units"] == 249 and cfg["h200-class-e1m2-area"]["mac.units"] == 262


def test_native_design_points_time_the_step_study():
    """Each equal-count point is the step study's H200-class run (docs/results/sim-h200-step.json): the same time
    and the same dynamic energy, with static energy beside it."""
    rows = json.load(open(os.path.join(ROOT, "docs", "results", "sim-h200-step.json")))["rows"]
    row = next(r for r in rows if r["shapes"] == "workloads/shapes/dense-1.5b.csv" and r["mac_kind"] == "e1m2"
               and not r["sr_as_fast_as_rtne"])
    # The study was run under the original SR draw (docs/spec.md §4), whose Philox rate its rows assume.
    t = json.loads(sim_json("--shapes", row["shapes"], "--config", "h200-class-e1m2", "--recipe", row["recipe"],
                            "--sr-draw", "philox1"))["total"]
    assert t["time_us"] == row["time_us"]
    static = t["energy_pj"].pop("static")
    assert t["energy_pj"] == row["energy_by_part_pj"]
    assert static > 0


def priced(*extra):
    """teaching.cfg with every area key and leakage set: round numbers."""
    return ["--config", "teaching", "--area.mac_e2m1_nand2", "1000", "--area.mac_e1m2_nand2", "800",
            "--area.mac_dual_nand2", "1300", "--area.rht_lane_nand2", "500", "--area.quant_lane_nand2", "700",
            "--area.acc_lane_nand2", "300", "--area.um2_per_nand2", "0.05", "--energy.leak_mw_per_mm2", "200",
            *extra]


def test_static_energy_is_leakage_times_built_area_times_time():
    j = json.loads(sim_json(*KERNEL, *priced()))
    c = j["config"]
    per_unit = {"e2m1": 1000, "e1m2": 800, "dual": 1300}[c["mac.kind"]]
    mac_nand2 = c["tcu.count"] * c["mac.units"] * per_unit
    unit_nand2 = mac_nand2 + c["tcu.count"] * (c["rht.lanes"] * 500 + c["quant.lanes"] * 700 + c["acc.lanes"] * 300)
    mm2 = unit_nand2 * 0.05 * 1e-6
    static_mw = 200 * mm2
    assert j["area"] == pytest.approx({"mac_array_nand2": mac_nand2, "unit_nand2": unit_nand2,
                                       "mac_array_mm2": mac_nand2 * 0.05e-6, "unit_mm2": mm2,
                                       "static_mw": static_mw}, rel=1e-12)
    t = j["total"]
    # mW x us = nJ = 1000 pJ
    assert t["energy_pj"]["static"] == pytest.approx(static_mw * t["time_us"] * 1e3, rel=1e-12)
    assert t["energy_total_pj"] == pytest.approx(sum(t["energy_pj"].values()), rel=1e-12)


def test_doubling_the_mac_units_doubles_the_mac_area_and_its_leakage():
    one = json.loads(sim_json(*KERNEL, *priced()))
    units = one["config"]["mac.units"]
    two = json.loads(sim_json(*KERNEL, *priced("--mac.units", str(2 * units))))
    assert two["area"]["mac_array_nand2"] == 2 * one["area"]["mac_array_nand2"]
    assert two["area"]["mac_array_mm2"] == pytest.approx(2 * one["area"]["mac_array_mm2"], rel=1e-12)
    # The other units are as they were: the whole unit grows by one MAC array, its leakage by that array's.
    assert two["area"]["unit_nand2"] - one["area"]["unit_nand2"] == one["area"]["mac_array_nand2"]
    assert two["area"]["static_mw"] - one["area"]["static_mw"] == pytest.approx(
        200 * one["area"]["mac_array_mm2"], rel=1e-9)
    for j in (one, two):
        assert j["total"]["energy_pj"]["static"] == pytest.approx(
            j["area"]["static_mw"] * j["total"]["time_us"] * 1e3, rel=1e-12)


def test_a_model_step_reports_energy_per_token():
    j = json.loads(sim_json("--model", "workloads/models/gpt2.json", "--tokens", "64", *priced()))
    t = j["total"]
    assert t["tokens"] == 64
    assert t["energy_per_token_pj"] == pytest.approx(t["energy_total_pj"] / 64, rel=1e-12)
    assert t["tokens_per_s"] == pytest.approx(64 / (t["time_us"] * 1e-6), rel=1e-12)


def test_configs_without_area_report_as_before():
    """No area keys in the configuration, no area and no static energy in the report (tests/sim/expected holds
    the reports themselves)."""
    j = json.loads(sim_json(*KERNEL, "--config", "h100-class"))
    assert "area" not in j and "static" not in j["total"]["energy_pj"]
    assert not [k for k in j["config"] if k.startswith("area.") or k == "energy.leak_mw_per_mm2"]


def test_leakage_without_an_area_factor_is_refused():
    p = fp4lab("sim", *KERNEL, "--config", "teaching", "--energy.leak_mw_per_mm2", "100")
    assert p.returncode == 2 and "area.um2_per_nand2" in p.stderr
