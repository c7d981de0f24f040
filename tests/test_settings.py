"""The environment settings (harness/settings.py): one table, read once on rank 0,
installed on every rank, recorded and echoed."""
import os
import subprocess
import sys

import pytest

from harness import settings
from tests.conftest import BIN, HANG, MPIRUN_STDIN, ROOT, dat_text, mpi_env, mpirun, results


def test_read_takes_the_set_settings_and_refuses_unknown_names():
    assert settings.read({"PATH": "/bin", "HPCAI500_IC_WIDTH": "8"}) == {"HPCAI500_IC_WIDTH": "8"}
    with pytest.raises(settings.SettingError, match=r"^environment: found HPCAI500_IC_WIDHT, expected one of the "
                                                    r"settings \(HPCAI500_IC_WIDTH, "):
        settings.read({"HPCAI500_IC_WIDHT": "8"})


@pytest.mark.parametrize("name,text,expected", [
    ("HPCAI500_IC_WIDTH", "0", "an integer >= 1"),
    ("HPCAI500_IC_STAGES", "3,x", "integers >= 1 separated by commas"),
    ("HPCAI500_EWA_BACKBONE", "vgg16", "auto or resnet50 or small"),
    ("HPCAI500_EWA_BOX_ORDER", "yxy", "two y, two x and at most one c"),
    ("HPCAI500_PEAK_TFLOPS", "fp64=3", "Tflops per rank"),
    ("HPCAI500_FAULT", "1", "RANK:STEP|eval|roofline"),
    ("HPCAI500_WATCHDOG", "-1", "seconds >= 0"),
    ("HPCAI500_SUBMISSION_STATUS", "lab", "onprem or cloud or preview or research"),
])
def test_a_bad_value_names_the_setting_and_what_it_expects(name, text, expected):
    with pytest.raises(settings.SettingError) as e:
        settings.read({name: text})
    assert str(e.value).startswith(f"environment: found {name}={text!r}, expected {expected}")
    with pytest.raises(settings.SettingError, match=f"^{name}="):
        settings.value(name, {name: text})


def test_value_parses_by_the_table_and_defaults_when_unset():
    env = {"HPCAI500_IC_STAGES": "1,1,1,1", "HPCAI500_EWA_PREFETCH": ""}
    assert settings.value("HPCAI500_IC_STAGES", env) == (1, 1, 1, 1)
    assert settings.value("HPCAI500_EWA_PREFETCH", env) == 0          # empty = unset: the default
    assert settings.value("HPCAI500_EWA_BOX_ORDER", env) is None             # detected from the data
    assert settings.value("HPCAI500_IC_WIDTH", env) is None            # the workload's own default


def test_install_makes_the_environment_hold_exactly_rank_0s_values():
    env = {"PATH": "/bin", "HPCAI500_FAULT": "1:eval", "HPCAI500_IC_WIDTH": "4"}
    settings.install({"HPCAI500_IC_WIDTH": "8"}, env)
    assert env == {"PATH": "/bin", "HPCAI500_IC_WIDTH": "8"}


def test_report_lines_and_test_only_settings():
    values = {"HPCAI500_IC_WIDTH": "8", "HPCAI500_EWA_BOX_ORDER": "xyxyc"}
    assert settings.test_only(values) == ["HPCAI500_IC_WIDTH=8"]
    lines = settings.describe(values)
    assert lines[0] == "ENV     : HPCAI500_IC_WIDTH=8 (ic: ResNet stem width (unset: 64, ResNet-50); test-only)"
    assert settings.describe({}) == ["ENV     : no HPCAI500_* setting (all defaults)"]


def test_the_libraries_variables_are_recorded_but_the_launchers_are_not():
    environ = {"NCCL_DEBUG": "INFO", "OMPI_MCA_num_procs": "4", "OMPI_COMM_WORLD_RANK": "0", "PMIX_RANK": "0",
               "TORCHINDUCTOR_CACHE_DIR": "/c", "OMP_NUM_THREADS": "4", "HPCAI500_SEED": "1", "PATH": "/bin",
               "TF_CLI_CONFIG_FILE": "/root/.terraformrc", "TF_VAR_region": "eu", "TF_XLA_FLAGS": "--x"}
    from harness import frameworks
    values = settings.library(environ, frameworks.own_variables())   # Terraform's TF_CLI_*, TF_VAR_*: not TensorFlow's
    assert values == {"NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": "4", "TF_XLA_FLAGS": "--x",
                      "TORCHINDUCTOR_CACHE_DIR": "/c"}
    assert list(values) == sorted(values)
    env = {"library_settings": values, "library_settings_differ_on_ranks": []}
    assert settings.describe_library(env)[0] == "LIB ENV : NCCL_DEBUG=INFO" and len(settings.describe_library(env)) == 4
    assert settings.describe_library({"library_settings": {}, "library_settings_differ_on_ranks": [3, 5]}) == [
        "LIB ENV : none set (NCCL_*, HOROVOD_*, TF_*, TORCH*, OMP_*, MKL_*, ...: settings.LIBRARY_PREFIXES)",
        "LIB ENV : differs from rank 0's on world rank(s) 3, 5 (results.json: environment.library_settings_by_rank)"]
    assert settings.describe_library({"hosts": ["n1"]}) == []     # a run recorded before: no lines


def test_a_framework_the_run_does_not_import_leaves_its_variables_out():
    """hpcai500.py and `make` set TF_USE_LEGACY_KERAS and TF_CPP_MIN_LOG_LEVEL for every run:
    a PyTorch-only run imports no TensorFlow, so they cannot change its figures. Each
    framework's prefixes are its own (its facts' OWN_VARIABLES): without them no TF_ or
    TORCH variable is a library's."""
    from harness import frameworks
    environ = {"TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2", "XLA_FLAGS": "--x", "HOROVOD_CYCLE_TIME": "1",
               "TORCH_NCCL_BLOCKING_WAIT": "1", "PYTORCH_CUDA_ALLOC_CONF": "a", "NCCL_DEBUG": "INFO",
               "OMP_NUM_THREADS": "4"}
    own = frameworks.own_variables()
    assert settings.library(environ, own, frameworks.unread_variables(("pytorch",))) == {
        "NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": "4", "PYTORCH_CUDA_ALLOC_CONF": "a", "TORCH_NCCL_BLOCKING_WAIT": "1"}
    assert settings.library(environ, own, frameworks.unread_variables(("tensorflow",))) == {
        "HOROVOD_CYCLE_TIME": "1", "NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": "4", "TF_CPP_MIN_LOG_LEVEL": "2",
        "TF_USE_LEGACY_KERAS": "1", "XLA_FLAGS": "--x"}
    assert settings.library(environ, own, frameworks.unread_variables(("tensorflow", "pytorch"))) == environ
    assert settings.library(environ) == {"NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": "4"}


def test_every_setting_the_code_names_is_in_the_table():
    """No module reads an HPCAI500_* variable the table does not know."""
    import re
    named = set()
    for folder in ("harness", "kernels"):
        for path in (ROOT / folder).rglob("*.py"):
            named |= set(re.findall(r"HPCAI500_[A-Z_]+[A-Z]", path.read_text()))
    assert named - {"HPCAI500_"} <= set(settings.TABLE), named - set(settings.TABLE)


def _mpmd(tmp_path, env0: dict, env1: dict, lines: dict):
    """Two ranks whose environments differ: rank 0 gets env0, rank 1 env1."""
    path = tmp_path / "in.dat"
    path.write_text(dat_text(l5=str(tmp_path / "runs"), **lines))
    base = mpi_env()
    for k in [k for k in base if k.startswith("HPCAI500_")]:     # mpi_env's quick roofline too, as before
        del base[k]
    app = [sys.executable, str(ROOT / "hpcai500.py"), str(path)]
    cmd = [str(BIN / "mpirun"), *MPIRUN_STDIN, "--oversubscribe",
           "-np", "1", "env", *[f"{k}={v}" for k, v in env0.items()], *app, ":",
           "-np", "1", "env", *[f"{k}={v}" for k, v in env1.items()], *app]
    return subprocess.run(cmd, cwd=tmp_path, env=base, capture_output=True, text=True, timeout=HANG)


@pytest.mark.mpi
def test_every_rank_runs_with_rank_0s_settings(tmp_path):
    """A fault armed in rank 1's own environment only is not rank 0's setting: the run
    passes; armed in rank 0's environment for rank 1, it reaches rank 1 and ends the job.
    A library's variable (NCCL_DEBUG, which no CPU run reads) is not ours to install: each
    rank's is recorded, rank 0's echoed, and the ranks where it differs named. Trained by
    PyTorch: settings are the harness's, and its ranks start in a fraction of TensorFlow's
    time."""
    lines = dict(l9=1, l10=2, l11=1, l15=1, l30=1, l35="pytorch")
    quick = {"HPCAI500_ROOFLINE_QUICK": "1"}
    p = _mpmd(tmp_path, {**quick, "NCCL_DEBUG": "WARN"},
              {**quick, "HPCAI500_FAULT": "1:roofline", "NCCL_DEBUG": "INFO"}, lines)
    assert p.returncode == 0, p.stderr[-2000:]
    res = results(tmp_path / "runs")
    assert res["settings"] == quick
    assert "ENV     : HPCAI500_ROOFLINE_QUICK=1 (micro-kernels at test sizes (1); test-only)" in p.stdout
    env = res["environment"]
    assert env["library_settings"]["NCCL_DEBUG"] == "WARN"
    # hpcai500.py sets TensorFlow's TF_USE_LEGACY_KERAS on every rank; a PyTorch-only run reads none of TF_*
    assert not [k for k in env["library_settings"] if k.startswith("TF_")] and "LIB ENV : TF_" not in p.stdout
    assert env["library_settings_differ_on_ranks"] == [1] and env["library_settings_by_rank"]["1"]["NCCL_DEBUG"] == "INFO"
    assert "LIB ENV : NCCL_DEBUG=WARN" in p.stdout
    assert "LIB ENV : differs from rank 0's on world rank(s) 1" in p.stdout
    p = _mpmd(tmp_path, {**quick, "HPCAI500_FAULT": "1:roofline"}, quick, lines)
    assert p.returncode != 0 and "rank 1 failed during roofline micro-kernels" in p.stderr, p.stderr[-2000:]


@pytest.mark.mpi
def test_an_unknown_setting_stops_every_rank_with_one_message(tmp_path):
    path = tmp_path / "in.dat"
    path.write_text(dat_text(l5=str(tmp_path / "runs")))
    os.environ["HPCAI500_IC_WIDHT"] = "8"
    try:
        p = mpirun(2, ["--check", str(path)], tmp_path)
    finally:
        del os.environ["HPCAI500_IC_WIDHT"]
    assert p.returncode == 1 and p.stderr.count("hpcai500: error:") == 1, p.stderr[-2000:]
    assert "environment: found HPCAI500_IC_WIDHT, expected one of the settings" in p.stderr
