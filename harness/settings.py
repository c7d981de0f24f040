"""Every environment setting the harness reads, in one table.

A setting that can change a figure must be on record, and the same on every rank.
World rank 0 reads the HPCAI500_* variables once (`read`: an unknown name or a bad
value is an error naming it), the values travel with the input file to every rank
(harness/plan.py), `install` makes every rank's environment hold exactly rank 0's
values, and the run records them in results.json and echoes them in the report's
parameter block. The harness reads a setting through `value(name)`, which parses it by
the table; the fault hook and the kernels package (which also runs alone) read the
environment that `install` set, with the parsers the table uses.

`test_only` settings shrink or fake something for tests on small machines: a ranking
(closed) result must not set any of them (harness/division.py). Pure functions; the
environment is passed in (os.environ by default).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

from harness import checkpoint, elastic, fault

PREFIX = "HPCAI500_"

# A box row's column order, as a user writes it (HPCAI500_EWA_BOX_ORDER); ewa's box math
# (harness/workloads/detection.py) takes its columns from box_columns
BOX_ORDER_FORM = "two y, two x and at most one c (e.g. yxyxc, yyxxc, cyxyx)"


def box_columns(order: str) -> list[int]:
    """The columns of (class, ymin, xmin, ymax, xmax) in a box row described by `order`:
    two y and two x letters, the first of each the minimum, and `c` for the class
    (appended when left out). box_columns('xyxyc') == [4, 1, 0, 3, 2]. ValueError
    (saying BOX_ORDER_FORM) for anything else."""
    o = order.strip().lower()
    o = o if "c" in o else o + "c"
    if sorted(o) != sorted("cxxyy"):
        raise ValueError(BOX_ORDER_FORM)
    ys, xs = [i for i, ch in enumerate(o) if ch == "y"], [i for i, ch in enumerate(o) if ch == "x"]
    return [o.index("c"), ys[0], xs[0], ys[1], xs[1]]


def _int(low: int):
    def parse(text: str) -> int:
        if not text.strip().lstrip("+").isdigit() or int(text) < low:
            raise ValueError(f"an integer >= {low}")
        return int(text)
    return parse


def _ints(text: str) -> tuple[int, ...]:
    parts = [p.strip() for p in text.split(",")]
    if not parts or not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise ValueError("integers >= 1 separated by commas (e.g. 3,4,6,3)")
    return tuple(int(p) for p in parts)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise ValueError("seconds >= 0")
    return value


def _positive_seconds(text: str) -> float:
    value = _seconds(text)
    if not value > 0:
        raise ValueError("seconds > 0")
    return value


def _one_of(*names: str):
    def parse(text: str) -> str:
        if text.strip().lower() not in names:
            raise ValueError(" or ".join(names))
        return text.strip().lower()
    return parse


def resume_differences(there: dict, now: dict) -> list[str]:
    """What a --resume may not change: the settings in force (`now`, as `read` gives them)
    against the run's (`there`), one phrase each, naming the option that sets it; those that
    change no finished test's figures (not `figures`, or `per_invocation`) may differ."""
    out = []
    for name in sorted(set(there) | set(now)):
        s = TABLE.get(name)
        if there.get(name) == now.get(name) or (s and (not s.figures or s.per_invocation)):
            continue
        said = lambda v: "unset" if v is None else f"{name}={v}"   # noqa: E731
        out.append(f"{said(there.get(name))} there, {said(now.get(name))} now"
                   + (f" ({s.flag} sets it)" if s and s.flag else ""))
    return out


def _text(text: str) -> str:
    if not text.strip():
        raise ValueError("a non-empty text")
    return text.strip()


def _names(text: str) -> tuple[str, ...]:
    names = tuple(v.strip() for v in text.split(",") if v.strip())
    if not names:
        raise ValueError("file names separated by commas")
    return names


def _box_order(text: str) -> str:
    box_columns(text)       # ValueError saying the form
    return text.strip().lower()


def _peak(text: str) -> str:
    from kernels.peak import parse
    parse(text)
    return text.strip()


def _fault(text: str):
    return fault.parse(text)


@dataclass(frozen=True)
class Setting:
    name: str
    parse: Callable[[str], object]   # the value, or ValueError saying what is expected
    default: object                  # when unset (None: the feature's own behaviour, see `affects`)
    affects: str
    test_only: bool = False          # a ranking (closed) result must leave it unset
    figures: bool = True             # it can change a reported figure
    flag: str = ""                   # the command-line option that sets it ("": none)
    per_invocation: bool = False     # a --resume may change it: it changes no finished test's figures (each test
    #                                  records what its own faults cost), only what a fault costs from now on


TABLE = {s.name: s for s in (
    Setting("HPCAI500_IC_WIDTH", _int(1), None, "ic: ResNet stem width (unset: 64, ResNet-50)", test_only=True),
    Setting("HPCAI500_COSMO_WIDTH", _int(1), None,
            "cosmoflow: first block's filters, doubling per block (unset: 32, the reference)", test_only=True),
    Setting("HPCAI500_DEEPCAM_WIDTH", _int(1), None,
            "deepcam: entry convolution's filters, every channel count scaled alike (unset: 32, the reference)",
            test_only=True),
    Setting("HPCAI500_DEEPCAM_MIDDLE", _int(0), None, "deepcam: middle-flow blocks (unset: 16, the reference)",
            test_only=True),
    Setting("HPCAI500_EVAL_CHUNK", _int(1), None,
            "validation samples an evaluation reduces at a time, where the quality is a mean over samples"
            " (unset: as many as 256 MB of scores hold)", test_only=True),
    Setting("HPCAI500_IC_STAGES", _ints, None, "ic: bottlenecks per stage (unset: 3,4,6,3, ResNet-50)",
            test_only=True),
    Setting("HPCAI500_IC_LABEL_OFFSET", _int(0), None,
            "ic: subtracted from the TFRecord labels (unset: detected from the labels)"),
    Setting("HPCAI500_EWA_BACKBONE", _one_of("auto", "resnet50", "small"), "auto",
            "ewa: backbone (auto: ResNet-50 trunk at >= 384 px, a small one below)", test_only=True),
    Setting("HPCAI500_EWA_BOX_ORDER", _box_order, None,
            "ewa: column order of the published box rows (unset: detected from the data)"),
    Setting("HPCAI500_EWA_VAL", _names, None, "ewa: validation year files (unset: the last file by name)"),
    Setting("HPCAI500_EWA_PREFETCH", _int(0), 0, "ewa: tf.data prefetch depth of the feed (0: none)"),
    Setting("HPCAI500_ROOFLINE_QUICK", _one_of("0", "1"), "0", "micro-kernels at test sizes (1)", test_only=True),
    Setting("HPCAI500_PEAK_TFLOPS", _peak, None, "theoretical peak per rank, Tflops (unset: NVML table)"),
    Setting("HPCAI500_FAULT", _fault, None, "fault injection for the reliability tests", test_only=True),
    Setting("HPCAI500_ON_FAULT", _one_of(*elastic.POLICIES), elastic.DEFAULT,
            "what a lost rank costs: abort the run, drop the base models it touched, or retrain them on the"
            " survivors (set by --on-fault)", flag="--on-fault", per_invocation=True),
    Setting(checkpoint.SETTING, _int(0), 1,
            "evaluations between a base model's checkpoints (1: each evaluation before the last; 0: none); they are"
            " what --resume continues an interrupted test from", per_invocation=True),
    Setting(elastic.DETECTOR_SETTING, _seconds, 0.0,
            "s a rank may go without ULFM's heartbeat before it is taken for lost (a silent rank: stopped, frozen;"
            " 30 suits); 0: the detector off; armed where the launch has ULFM and sets no mpi_ft_detector parameter"
            " itself",
            figures=False),
    Setting("HPCAI500_WATCHDOG", _seconds, 1800.0, "watchdog limit, s (read by the command line)", figures=False,
            flag="--watchdog"),
    Setting("HPCAI500_HEARTBEAT", _positive_seconds, 5.0,
            "s between world rank 0's stamps of the run folder's heartbeat (a reader on another node calls the run"
            " dead after 12 missed)", figures=False),
    Setting("HPCAI500_SUBMITTER_ORG", _text, "unnamed submitter", "MLLOG submission_org", figures=False),
    Setting("HPCAI500_SUBMITTER_PLATFORM", _text, None,
            "MLLOG submission_platform (unset: nodes x CPU or GPU model)", figures=False),
    Setting("HPCAI500_SUBMISSION_STATUS", _one_of("onprem", "cloud", "preview", "research"), "onprem",
            "MLLOG submission_status", figures=False),
)}


class SettingError(ValueError):
    """An unknown HPCAI500_* variable or a bad value; the message names it."""


def read(environ=None) -> dict[str, str]:
    """The HPCAI500_* variables that are set, validated: {name: text as given}."""
    environ = os.environ if environ is None else environ
    values = {}
    for name in sorted(k for k in environ if k.startswith(PREFIX)):
        if name not in TABLE:
            raise SettingError(f"environment: found {name}, expected one of the settings "
                               f"({', '.join(TABLE)}); see docs/running.md, 'Settings'")
        text = environ[name]
        try:
            TABLE[name].parse(text)
        except ValueError as e:
            raise SettingError(f"environment: found {name}={text!r}, expected {e}") from None
        values[name] = text
    return values


def install(values: dict[str, str], environ=None) -> None:
    """Make `environ` hold exactly these HPCAI500_* values (rank 0's, on every rank)."""
    environ = os.environ if environ is None else environ
    for name in [k for k in environ if k.startswith(PREFIX) and k not in values]:
        del environ[name]
    environ.update(values)


def value(name: str, environ=None):
    """A setting's parsed value, or its default when unset (or empty)."""
    environ = os.environ if environ is None else environ
    setting = TABLE[name]
    text = environ.get(name, "")
    if not text.strip():
        return setting.default
    try:
        return setting.parse(text)
    except ValueError as e:
        raise SettingError(f"{name}={text!r}: expected {e}") from None


def test_only(values: dict[str, str]) -> list[str]:
    """The test-only settings among `values`, as NAME=value."""
    return [f"{n}={v}" for n, v in values.items() if TABLE[n].test_only]


def describe(values: dict[str, str]) -> list[str]:
    """The report's parameter lines: every setting that is set, what it affects."""
    if not values:
        return ["ENV     : no HPCAI500_* setting (all defaults)"]
    return [f"ENV     : {n}={v} ({TABLE[n].affects}{'; test-only' if TABLE[n].test_only else ''})"
            for n, v in values.items()]


# The libraries' own environment variables that can change a figure: threads, allocators,
# collectives' algorithms and transports, compilers. The harness reads none of them; the
# run records the ones that are set (`library`) and echoes them in the report, so that two
# results that differ by one of them say so. Not the MPI's: mpirun puts its own MCA
# parameters (num_procs, initial_wdir, ...) into every rank's environment, where a user's
# cannot be told from them (the MPI library's version is in results.json; its parameters
# are ompi_info's to tell).
# These are the libraries every framework may load; each framework's own (its facts'
# OWN_VARIABLES: TF_, HOROVOD_, TORCH, ...) come from the registry (frameworks.own_variables).
LIBRARY_PREFIXES = ("NCCL_", "GLOO_", "CUDA_", "CUBLAS", "CUDNN_", "OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_",
                    "DNNL_", "ONEDNN_", "UCX_", "FI_", "MALLOC_", "LD_PRELOAD",
                    "NVIDIA_TF32_OVERRIDE")   # 0: no TF32 in cuBLAS and cuDNN, every framework (kernels/peak.py)
# Terraform's variables share TensorFlow's TF_ prefix (its CLI configuration, input
# variables, tokens, plugin cache, logs): none of these prefixes occurs anywhere in the
# files of TensorFlow 2.18, Keras or Horovod (grepped, libtensorflow_cc.so.2 included), so
# leaving them out cannot hide a TensorFlow setting, and a report no longer lists a
# Terraform file among the settings that can change a figure (machines here set
# TF_CLI_CONFIG_FILE).
NOT_LIBRARY_PREFIXES = ("TF_CLI_", "TF_VAR_", "TF_TOKEN_", "TF_REGISTRY_", "TF_PLUGIN_", "TF_LOG_PATH",
                        "TF_LOG_CORE", "TF_LOG_PROVIDER", "TF_IN_AUTOMATION", "TF_INPUT", "TF_WORKSPACE",
                        "TF_IGNORE", "TF_STATE_PERSIST")


def library(environ=None, own: tuple[str, ...] = (), unread: tuple[str, ...] = ()) -> dict[str, str]:
    """The libraries' variables that are set: of LIBRARY_PREFIXES and the frameworks' `own`
    prefixes (frameworks.own_variables), Terraform's apart (NOT_LIBRARY_PREFIXES) and those
    of the prefixes `unread` (the variables of a framework the run does not import:
    frameworks.unread_variables): {name: value}, sorted. Pure."""
    environ = os.environ if environ is None else environ
    return {n: environ[n] for n in sorted(environ)
            if n.startswith(LIBRARY_PREFIXES + own) and not n.startswith(NOT_LIBRARY_PREFIXES + unread)}


def describe_library(environment: dict) -> list[str]:
    """The report's parameter lines for the libraries' variables in force (rank 0's, as
    results.json's `environment` records them), and the world ranks where they differ from
    rank 0's, if any; none for a run recorded before they were."""
    if "library_settings" not in environment:
        return []
    values, differ = environment["library_settings"], environment["library_settings_differ_on_ranks"]
    lines = [f"LIB ENV : {n}={v}" for n, v in values.items()] or [
        "LIB ENV : none set (NCCL_*, HOROVOD_*, TF_*, TORCH*, OMP_*, MKL_*, ...: settings.LIBRARY_PREFIXES)"]
    if differ:
        lines.append(f"LIB ENV : differs from rank 0's on world rank(s) {', '.join(map(str, differ))}"
                     " (results.json: environment.library_settings_by_rank)")
    return lines

