"""The results record: what results.json holds, as typed records with a schema version.

`TestResult` is one finished test (one repetition); `Record` the whole invocation, its
tests as `TestResult`s and its repetition summaries as `metrics.Repeats`. results.json
is `Record` as JSON, and every reader of it (the report's `--summarize`, `--resume`,
`--verify`) goes through `load`, which gives the same typed `Record` back: it refuses a
file of another major schema version with a message naming both versions, and a record
missing a key naming the key and the test, instead of failing later on a lookup.

Pure data: no MPI, no TensorFlow. World rank 0 builds the records (harness/run.py
measures a test, harness/report.py writes the record).
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import MISSING, asdict, dataclass, field, fields

from harness.frameworks import DEFAULT as DEFAULT_FRAMEWORK
from harness.metrics import Repeats

# major.minor: the major changes when a key is removed or changes meaning (readers of
# another major refuse the file); the minor when keys are only added.
SCHEMA = "2.23"   # 2.2: TestResult.higher_is_better; the control plane's timings (reduce_seconds,
                 #   gather_seconds, rank0_peak_rss_bytes; Record.write_seconds)
                 # 2.3: a test timed under metrics.SHORT_SPAN warns, and its scaling line is marked
                 # 2.4: TestResult.exchange (each job's gradient exchange and library);
                 #   environment.node_of_rank (the node index of each world rank)
                 # 2.5: TestResult.other_load (cores other processes kept busy, per machine)
                 # 2.6: TestResult.framework (lines 34-35)
                 # 2.7: TestResult.mode (lines 36-37)
                 # 2.8: Record.skipped[].cause ("ranks" or "mode"; absent: "ranks", as before);
                 #   the PyTorch conventions line states the CPUs' layout (its facts' LAYOUT)
                 # 2.9: TestResult.invocation; the report's test blocks begin with a `Test N :` line
                 #   (framework, mode, repetition, earlier invocation), its T/V columns fit the code,
                 #   every Scaling line names its framework, the Parallel modes block reads its
                 #   figures anew (report.row, report.summary_lines, experiments.mode_lines)
                 #   Record.skipped[].cause may also be "framework", "split", "adasum", "aggregation" or
                 #   "batch" (SKIP_CAUSES: a test the sweep's cross product forces that cannot run is skipped,
                 #   no longer refused whole); skipped[].reason is the located `FILE:LINE: found ...` message
                 # 2.10: elastic bagging (harness/elastic.py): Record.fault_tolerance (policy, ULFM on);
                 #   TestResult.losses, jobs_lost, launch_ranks; skipped[].cause "lost" (a test left out
                 #   once ranks were lost, or whose every base model lost one)
                 # 2.11: losses outside a test's steps survived: fault_tolerance.losses (every loss of
                 #   the run); roofline per_rank and environment.node_of_rank by launch rank, null for a
                 #   rank lost in the roofline; a test during which world rank 0 was lost is skipped
                 #   ("lost") and a new coordinator goes on
                 # 2.12: --on-fault retrain: TestResult.retrained (the lost base models a wave trained
                 #   again, their wave and launch ranks); evaluations[].wave (a wave's points, on the
                 #   test's clock); losses[].wave (a loss found in a wave); jobs_lost stays the models
                 #   dropped, so a retrained one is not in it
                 # 2.13: Record.tv_legend (the T/V legend the report printed: it lists the codes of the
                 #   frameworks registered then, so --verify re-renders a header with its own run's)
                 # 2.14: the FAULTS line of --on-fault abort names how the job ends where the launch
                 #   has ULFM (each rank's exit status 1; MPI_Abort there ends only its caller)
                 # 2.15: PyTorch's conventions say a job of one rank has no DDP (its gradients were
                 #   cast or quantised by line 21's DDP hook before, where its Exchange said none)
                 # 2.16: TensorFlow's conventions state, for a deepcam input, where its DeepLabv3+ skips
                 #   the padding taps of a dilated convolution that the FLOP count credits
                 # 2.17: TestResult.data_facts (the data read as the division judges it: the harness's
                 #   marker, sample counts, the workload's other published facts; harness/division.py);
                 #   the conventions hold each workload's `<workload>: data facts ...` line; a path to
                 #   data hpcai500 wrote, or to a set whose facts are not the published set's, is open.
                 #   A file of < 2.17 lacks them: None, its division judged without them
                 # 2.18: what faults cost: fault_tolerance.losses[] name their hosts (and, in a resumed run,
                 #   the invocation that had them: a --resume keeps the earlier losses); --on-fault abort
                 #   under ULFM records the run failed with its loss; the report's Losses line says what
                 #   the loss cost (retrain's waves' seconds, drop's survivors' Time), a test laid out on a
                 #   shrunk world has a World line, and the footer counts the ranks lost, the base models
                 #   trained again and dropped; environment.node_inventory[].cores_of_ranks (the cores the
                 #   node's ranks are bound to, their union: the Nodes line says it, not rank 0's binding)
                 # 2.19: one device record per framework (issue 67): environment.rank0_devices_by_framework
                 #   (name -> its set-up record; rank0_devices stays the first's), each record's "gpu" (the GPU
                 #   pinned: CUDA_VISIBLE_DEVICES entry, PCI bus id, NVML UUID and index) and "nccl"; the
                 #   conventions' Devices line names each framework's device, threads and feed cores where they
                 #   differ (where they agree it reads as before; --verify takes the line as recorded)
                 # 2.20: PyTorch on GPUs (issue 67): environment.torch_math (the torch.backends switches set
                 #   alike for the micro-kernels and training, whether its fp32 is held to the TF32 peak; {} on
                 #   a CPU) and the PyTorch GPU line rendered from it; PyTorch's roofline peak looked up with its
                 #   own switches, its convolution channels-last on a GPU (per_rank conv.layout "NHWC");
                 #   NVIDIA_TF32_OVERRIDE among library_settings; skipped[].cause may be "device" (a
                 #   framework's precision its rank's device cannot train natively: bf16 before Ampere)
                 # 2.21: a tuning run (--tune, harness/tune.py): Record.tuning (its plan, the tuning table, the
                 #   speed picks, the best finalist, the tuned file) and each trial's TestResult.trial; config
                 #   .alternatives (the values a line of dat.SINGLE lists for the search)
                 # 2.22: fault_tolerance.detector; Record.relaunches, node_maps (CHANGELOG.md)
                 # 2.23: TestResult.checkpoints (the base models' checkpoints along the test, their cost),
                 #   TestResult.resumed (a test --resume continued from them, what the interruption cost)


# Why a test of the sweep did not run: Record.skipped[].cause -> what the report's footer says of
# those tests ("N tests skipped because ..."), in the footer's order. "ranks" and "mode" word
# it as schema 2.8 reports did, so that --verify renders their footers alike (harness/plan.py
# decides each test's cause).
SKIP_CAUSES = {
    "ranks": "they need more ranks than the run has",
    "mode": "their parallel mode (line 37) needs P >= 2",
    "framework": "their framework (line 35) cannot carry them (lines 7, 22, 33)",
    "split": "their parallel mode (line 37) cannot run with their other values",
    "adasum": "Adasum (line 22) needs P a power of 2",
    "aggregation": "their workload lacks line 24's aggregation",
    "batch": "P x B (lines 11, 14) exceeds their training set",
    "lost": "ranks were lost before or while they ran (--on-fault drop)",
    "device": "their precision (line 17) is not native on a rank's device (bf16 on a GPU before Ampere)",
}

MAJOR = SCHEMA.split(".")[0]   # readers refuse a file of another major
ERROR_PREFIX = "error: "       # an `interrupted` reason that begins so: the run stopped on an error (a failed run)


def minor(schema: str) -> tuple[int, int]:
    """A schema version as (major, minor): minor("2.3") == (2, 3)."""
    major, _, rest = str(schema).partition(".")
    return int(major), int(rest or 0)


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class TestResult:
    """One repetition of one test of the sweep, as measured and derived on rank 0."""
    index: int                        # 1-based position in the sweep
    tv: str                           # T/V code (harness/dat.py)
    workload: str
    M: int                            # base models (jobs)
    P: int                            # ranks per base model
    B: int                            # per-rank batch (samples)
    precision: str
    sampler: str
    aggregation: str
    repetition: int                   # 0-based; the run used seed + repetition
    seed: int
    epochs: int                       # line 15: the epochs each base model may train
    epochs_trained: int               # epochs trained: fewer when the target stopped training (line 32)
    eval_every: int                   # line 31: evaluations every K epochs (0: at the end only)
    stop_at_target: bool              # line 32
    jobs: list                        # world ranks of each job, root first
    idle_ranks: list
    warnings: list
    division: str                     # closed (a ranking result) | open (harness/division.py)
    open_reasons: list                # why open: every condition of a closed result not met
    data: str                         # what was read
    train_samples: int                # samples in the training set
    val_samples: int
    forward_flops_per_sample: int     # FLOPs, analytic (Table 3 rules)
    training_flops_per_sample: int    # FLOPs, 3 x forward
    flops_by_operator: dict           # FLOPs per sample, forward, by Table 3 operator
    activations_per_sample: int       # output elements of every layer, forward
    weights: int                      # trainable parameters
    intensity: float                  # FLOPs / byte, estimate (harness/metrics.py)
    steps_per_epoch: list             # per job
    samples_trained: int              # samples, all jobs, all epochs
    total_flops: float                # FLOPs, all base models (Eq. 4-6)
    train_seconds: float              # s, world barrier to the last step, max over ranks (retrain: summed over
                                      #   the test's passes, each wave's its own max)
    train_seconds_min: float          # s, the fastest training rank
    staging: dict | None              # the Data Duplicator's copies, or None
    time_to_solution: float           # s, staging + rank 0's wall from the start of training to the end of the
                                      #   last evaluation (training, evaluations, waits for other jobs)
    eval_seconds: float               # s, all evaluations (prediction, waiting for the other jobs, reduction), max over the jobs' ranks (idle ranks: 0)
    evaluations: list                 # per evaluation: epoch, seconds (rank 0, since the start of training),
                                      #   quality (ensemble), base_quality (per job; null: not in it), wave (a
                                      #   wave of retrain's point: its epochs count from 1 again)
    time_to_quality: float | None     # s, the first evaluation reaching the target (staging apart) with as many
                                      #   models as the last (metrics.counted); None: never
    epochs_to_quality: int | None     # its epoch; None: never
    sampler_seconds: float            # s, drawing and sending the resamples (rank 0)
    flops: float                      # FLOP/s, total_flops / train_seconds (Eq. 6)
    vflops: float                     # FLOP/s, flops x penalty (Eq. 7-8)
    quality_name: str                 # "Top-1", "mAP@0.5", ...
    quality: float                    # the ensemble's, on the validation set
    base_quality: list                # each base model's, in job order
    target_quality: float
    penalty_n: float
    penalty: float                    # (quality / target)^n
    final_loss: list                  # last epoch's mean loss, each job's root
    utilisation: dict | None          # FLOPS over the used ranks' roofline figures
    telemetry: dict                   # harness/telemetry.py, reduced over training ranks
    vflops_per_watt: float | None     # valid FLOPs of the timed window / GPU-board J in it (FLOP/s per W)
    consistency: dict                 # max_diff, tolerance, passed
    resample: list                    # per job: size, out_of_bag, digest
    weights_digest: list              # per job, per rank: digest of the trained weights
    model_layers: list = field(default_factory=list)      # the framework walker's records (harness/verify.py)
    model_deviations: list = field(default_factory=list)  # from the reference model (describe_model)
    # Keys added by a later minor version have a default: what a file of an earlier minor,
    # which lacks the key, meant (harness/results.load fills it).
    higher_is_better: bool = True     # the quality's direction (False: an error, e.g. MAE); a 2.1 file lacks it, and
                                      #   every workload it could hold was higher-is-better
    reduce_seconds: float = 0.0       # s, rank 0: the world's reductions of the ensemble (scores, base qualities),
                                      #   all evaluations; the wait for the other jobs apart
    gather_seconds: float = 0.0       # s, rank 0: gathering every rank's record and measuring the test from them
    rank0_peak_rss_bytes: int = 0     # bytes, world rank 0's peak resident memory so far (ru_maxrss)
    exchange: list = field(default_factory=list)   # per job: its gradient exchange (lines 21-22, the torus's grid)
    #                                 and the library that carried it as Horovod reports its build
    #                                 (communication.exchange); a 2.3 file lacks it: [] (not recorded)
    other_load: list = field(default_factory=list)  # per machine of the test (telemetry.other_load): hosts, ranks,
    #                                 seconds (mean timed span, s), busy_cores, ranks_cores, other_cores (cores
    #                                 busy in the span: the machine's, the ranks', the rest); a 2.4 file: []
    framework: str = DEFAULT_FRAMEWORK   # line 35: the framework that trained it; a 2.5 file ran the default, the only one
    mode: str = "data"                # line 37: the parallel mode inside each base model, as written
    #                                 (harness/parallelism.py); a 2.6 file trained data-parallel, the only mode
    pipeline: dict | None = None      # a split mode's stages (parallelism.summary): the cut, each stage's measured
    #                                 idle share against the schedule's theory, bytes between stages a step
    #                                 against data parallelism's gradient bytes; None for data (and a 2.6 file)
    invocation: int = 0               # which invocation of the run timed it: 0 the first, k after the k-th
    #                                 --resume (Record.resumed); a 2.8 file: 0 (not recorded)
    losses: list = field(default_factory=list)     # ranks lost during the test (harness/elastic.record): ranks
    #                                 (launch ranks), hosts, phase (the world step that found them), seconds, jobs
    jobs_lost: list = field(default_factory=list)  # base models left out of every figure (lost a rank by the
    #                                 end of the last evaluation); the figures are the other M - len(jobs_lost)'s
    launch_ranks: list | None = None  # the launch rank of each rank of the test's world, where ranks were lost
    #                                 before it (its jobs, idle_ranks and records number the test's world)
    retrained: list = field(default_factory=list)  # --on-fault retrain: each lost base model trained again, in job
    #                                 order: job, wave (1, 2, ...), ranks (launch ranks of its wave's job, root
    #                                 first); its figures are in the per-model lists at its place, from that wave
    data_facts: dict | None = None    # the data read, as the division's data rule judges it (the workload's
    #                                 data_facts): marker (path of the harness's marker file: hpcai500 wrote the
    #                                 data; None: none), train_samples, val_samples (samples), and each fact its
    #                                 PUBLISHED states (ic: classes; ewa: images_per_file); None: a file of < 2.17
    checkpoints: dict | None = None   # the base models' checkpoints along the test (harness/checkpoint.py): every
    #                                 (HPCAI500_CHECKPOINT: evaluations between them), written (files, all
    #                                 models), seconds (s training waited, the slowest root's in all: its state
    #                                 taken, a write before waited for; outside train_seconds, as evaluations,
    #                                 inside time_to_solution), each_seconds (s, the slowest root's mean a
    #                                 checkpoint), write_seconds (s a write took behind training, the slowest
    #                                 root's mean), bytes (a checkpoint of each model, summed), refused (why a
    #                                 model wrote none); None: none due (0, a tuning run, a file of < 2.23)
    resumed: dict | None = None       # the test went on from its base models' checkpoints after an interruption
    #                                 (--resume): epoch (their evaluation epoch: epochs after it trained in this
    #                                 invocation), seconds_before (s, the slowest model's training through it, an
    #                                 earlier interruption's cost with it),
    #                                 lost_seconds (s, from the last of them written to training again: the work
    #                                 lost, the fault, the relaunch; wall clocks of two invocations), both in
    #                                 train_seconds, samples_before (the models kept, but one a wave trained
    #                                 again: in samples_trained, once); None: from its start
    trial: dict | None = None         # a tuning run's trial (--tune, harness/tune.py): number, stage, epochs and the
    #                                 choice of every knob (dat.KNOBS, tune.encode's values); None: a test of a sweep


@dataclass
class Record:
    """The whole invocation; rewritten after every finished test (harness/report.py)."""
    hpcai500: str                     # the harness's version
    run_dir: str
    input: dict                       # path, sha256, text (verbatim)
    config: dict                      # the parsed input (harness/dat.Config)
    settings: dict                    # HPCAI500_* environment settings in force (harness/settings.py)
    environment: dict                 # versions and node inventory (harness/telemetry.py)
    conventions: list                 # the report's conventions lines
    roofline: dict                    # precision -> micro-kernel figures
    schema: str = SCHEMA
    status: str = "running"           # running | complete | interrupted
    skipped: list = field(default_factory=list)   # tests not run: index, reason, cause (plan.Skipped)
    tests: list = field(default_factory=list)     # TestResult, in finishing order
    repeats: list = field(default_factory=list)   # metrics.Repeats: each repeated test's summary, when its last run ends
    charts: list = field(default_factory=list)
    resumed: list = field(default_factory=list)   # times of each --resume
    interrupted: dict | None = None   # reason, test, repetition
    fault_tolerance: dict | None = None   # policy (--on-fault), ulfm (bool: the launch keeps a job whose rank
    #                                 died), how (how that is known), from 2.11 losses (every loss of ranks in the
    #                                 run, elastic.entry: launch ranks, phase, seconds, time; absent: none yet),
    #                                 from 2.22 detector (elastic.Detector's fields, None: not known; absent: a
    #                                 file of < 2.22); None: a file of schema < 2.10
    write_seconds: list = field(default_factory=list)  # s, rank 0: each finished test's writing (MLLOG files,
                                      #   report.txt, results.json), in finishing order (harness/driver.py)
    tv_legend: str = ""               # the report's T/V legend (dat.TV_LEGEND when it ran); "": a file of schema < 2.13
    node_maps: list = field(default_factory=list)   # the node map (environment's hosts, node_of_rank,
    #                                   machine_of_node) of each invocation before this one, by invocation:
    #                                   a resumed run's tests read theirs ([]: never resumed; a file of < 2.22)
    relaunches: dict | None = None    # a relaunched run (harness/relaunch.py): launches (launches.json's, each
    #                                   launch before this invocation), started (s since the epoch: this one's
    #                                   start); None: launched once (and a file of schema < 2.22)
    tuning: dict | None = None        # a tuning run (--tune): budget_seconds, eta, plan (its stages), trials (the
    #                                 tuning table's rows), picks (the speed knobs' winners), best (the trial
    #                                 number of the tuned file's finalist), spent_seconds, planned, tuned (the
    #                                 tuned file's name in the run folder); None: a sweep (and a file of < 2.21)

    def json(self) -> dict:
        return asdict(self)

    @property
    def fault_losses(self) -> list[dict]:
        """fault_tolerance.losses: every loss of ranks in the run ([]: none, or a file of schema < 2.11)."""
        return (self.fault_tolerance or {}).get("losses", [])


def best_trial(rows: list[dict]) -> dict | None:
    """The trial of a tuning table's rows (Record.tuning's `trials`) with the highest VFLOPS, the
    earlier on a tie; a faulted trial, or one with no figures, is never it (None: no such trial)."""
    return max((r for r in rows if not r.get("fault") and r.get("vflops") is not None),
               key=lambda r: (r["vflops"], -r["number"]), default=None)


def load_run(run_dir: str) -> Record:
    """The results of a run folder (runs/<id>), refused (ValueError, naming the folder)
    where it is not one: not a folder, no results.json, an unreadable or foreign file."""
    if not os.path.isdir(run_dir):
        raise ValueError(f"{run_dir}: not a folder; give a runs/<id> folder")
    path = os.path.join(run_dir, "results.json")
    if not os.path.isfile(path):
        raise ValueError(f"{run_dir}: no results.json (not a runs/<id> folder?)")
    try:
        return load(path)
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: unreadable ({e})") from None


NODE_MAP = ("hosts", "node_of_rank", "machine_of_node")   # the environment's keys that place a test's ranks


def node_map(environment: dict, node_maps: list, invocation: int) -> dict:
    """The node map of the invocation that timed a test: `node_maps`' entry (Record.node_maps,
    the invocations before the last), else the last invocation's `environment`."""
    return node_maps[invocation] if invocation < len(node_maps) else {k: environment.get(k) for k in NODE_MAP}


LAUNCHES = "launches.json"   # in a run folder: each mpirun of a relaunched run (harness/relaunch.py)


def launches(run_dir: str) -> list[dict]:
    """A run folder's launches.json: each launch the relauncher made ([]: none, a run
    launched by hand, or an unreadable file: the relauncher writes it whole)."""
    try:
        with open(os.path.join(run_dir, LAUNCHES)) as f:
            found = json.load(f)
        return found if isinstance(found, list) else []
    except (OSError, ValueError):
        return []


def load(path: str) -> Record:
    """A results.json as a `Record`, refused (ValueError) if its schema's major version
    is not ours (the keys this version reads may not be there or mean something else),
    or if it lacks a key that its version always writes."""
    with open(path) as f:
        try:
            res = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(res, dict):
        raise ValueError(f"{path}: found a JSON {type(res).__name__}, expected a results object")
    found = str(res.get("schema", "1 (no schema key: written before schema versions)"))
    if found.split(".")[0] != MAJOR:
        raise ValueError(f"{path}: found results schema {found}, expected {MAJOR}.x "
                         f"(this is hpcai500 with results schema {SCHEMA}; read it with the version that wrote it)")
    record = _typed(Record, res, path)
    for key, cls in (("tests", TestResult), ("repeats", Repeats)):   # lists: _typed checked
        setattr(record, key, [_typed(cls, x, f"{path}: {key}[{i}]") for i, x in enumerate(getattr(record, key))])
    return record


def _typed(cls, obj, where: str):
    """`cls` from a JSON object: a key of a later minor version (unknown here) is left
    out, a key of ours missing takes its default (an earlier minor lacked it) or is
    refused, naming it, when it has none; a value of another JSON type than the field's
    is refused naming the field."""
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: found a JSON {type(obj).__name__}, expected an object")
    known = fields(cls)
    test = f" (test {obj.get('index')} rep {obj.get('repetition')})" if cls is TestResult else ""
    missing = [f.name for f in known if f.name not in obj and f.default is MISSING and f.default_factory is MISSING]
    if missing:
        raise ValueError(f"{where}{test}: found no {', '.join(missing)}, expected every key of a"
                         f" {cls.__name__} of results schema {MAJOR}.x")
    for f in known:
        if f.name in obj and not _fits(f.type, obj[f.name]):
            raise ValueError(f"{where}{test}: found {f.name} = {json.dumps(obj[f.name])[:60]}, expected {f.type}")
    return cls(**{f.name: obj[f.name] for f in known if f.name in obj})


_JSON = {"int": int, "float": (int, float), "str": str, "bool": bool, "list": list, "dict": dict}


def _fits(annotation: str, value) -> bool:
    """Whether a JSON value is of a field's annotated type ("float | None": a number or
    null; a whole number is a float too: another writer may write 2.0 as 2)."""
    return any(value is None if k == "None" else isinstance(value, _JSON[k])
               for k in (part.strip() for part in annotation.split("|")))
