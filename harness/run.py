"""One invocation: the tests of the sweep in order (HPL_pdtest), results kept as they finish.

After each test, world rank 0 rewrites report.txt and results.json atomically, so the
finished tests survive whatever happens to the next one.
"""
from __future__ import annotations

import os
import sys
import threading
import time

from harness import files
from harness.errors import RunError, first_failure
from harness.report import TOLERANCE


class Run:
    def __init__(self, cfg, tests, nodes, devices, run_dir, world, version, previous=None, ceilings=None):
        """On rank 0: `previous`, the results.json of the invocation being resumed;
        `ceilings`, the roofline micro-kernels' figures by precision."""
        from harness import dat, driver, flops
        self.cfg, self.tests, self.nodes, self.world = cfg, tests, nodes, world
        self.run_dir, self.version, self.devices = run_dir, version, devices
        self.results: list[dict] = []
        self.text = ""
        self.current = None            # the test under way, for an interruption record
        self.lock = threading.RLock()  # the signal thread may write while the main thread does
        self.conventions = [
            flops.CONVENTION,
            "Time: wall clock from a world barrier to the end of the last epoch, max over all ranks;"
            " evaluation and resampling timed apart",
            "FLOPS: analytic FLOPs of every sample trained by every base model / Time (Eq. 6)",
            "Replica consistency: max |w - w_root| over the trainable weights of every rank of each"
            f" base model; PASSED at <= {TOLERANCE:.0e}",
            f"Devices (rank 0): {devices['device']}, {devices['threads']} TensorFlow thread(s) per rank",
        ]
        self.conventions += _option_lines(cfg)
        from harness import workloads
        self.conventions += [f"{w}: {workloads.get(w).FLOPS_NOTE}" for w in cfg.workloads
                             if getattr(workloads.get(w), "FLOPS_NOTE", None)]
        if nodes.local_size > (os.cpu_count() or 1):
            self.conventions.append(
                f"Oversubscribed: {nodes.local_size} ranks on {os.cpu_count()} cores on a node; a test with"
                " idle ranks gives its ranks more than the share the kernels ran with")
        self.ceilings = ceilings or {}
        for c in self.ceilings.values():
            self.conventions += roofline_lines(c)
        self.meta = {"hpcai500": version, "status": "running", "run_dir": run_dir,
                     "input": {"path": cfg.path, "sha256": driver.sha256(cfg.text), "text": cfg.text},
                     "config": _plain(cfg), "environment": driver.environment(world, nodes, devices),
                     "conventions": self.conventions, "roofline": self.ceilings, "tests": self.results}
        if world.rank == 0:
            from harness import report
            self._emit(self._header(dat))
            if previous:  # the finished tests stand as they were; the report shows them again
                self.results.extend(previous["tests"])
                self.meta["resumed"] = previous.get("resumed", []) + [time.strftime("%Y-%m-%dT%H:%M:%S")]
                for r in self.results:
                    self._emit(report.row(r))
            self._save()

    # -- one test ---------------------------------------------------------------------
    def test(self, t, layout, warnings, data, watchdog, rep: int = 0) -> None:
        """Repetition `rep` of test `t`; it runs with seed + rep."""
        self.rep, self.seed = rep, self.cfg.seed + rep
        from harness import ensemble, sampler, staging, topology, workloads
        cfg, world = self.cfg, self.world
        wl = workloads.get(t.workload)
        self.current = t.index
        job, job_comm = topology.split(world, layout)

        t0 = time.perf_counter()
        indices = sampler.distribute(world, [list(j) for j in layout.jobs], data.n_train,
                                     cfg.sampler, self.seed, job_comm, job)
        sampler_seconds = time.perf_counter() - t0
        rec = {"rank": world.rank, "job": job, "seconds": 0.0, "eval_seconds": 0.0}
        log = self._log(t, layout, data, job, job_comm, indices)
        copy = self._stage(t, wl, data, job, job_comm, indices, log, watchdog)
        scores = None
        if job is None:
            world.Barrier()  # the start barrier the jobs' ranks enter inside train()
        else:
            scores = self._base_model(t, layout.M, wl, data, copy, job, job_comm, indices, rec, log, watchdog)
        # Jobs finish at different times (poisson resamples differ in size; idle ranks
        # have no job): wait for all of them here, politely, so the reduction is quick.
        watchdog.wait(world.Ibarrier(), f"waiting for the other jobs, test {t.index}")
        staging.cleanup(copy, cfg.staging_keep)
        t2 = time.perf_counter()
        total = ensemble.reduce_scores(world, scores, ensemble.reduced_shape(
            data.n_val, wl.score_width(data), layout.M, ensemble.stacks(wl)))
        rec["eval_seconds"] += time.perf_counter() - t2
        records = world.gather(rec, root=0)
        if world.rank == 0:
            from harness import metrics, report
            result = self._result(t, layout, warnings, wl, data, records, total, sampler_seconds, metrics)
            with self.lock:
                self.results.append(result)
                self._write_mllogs(t, records)
                self._emit(report.row(result))
                if self.rep == self.cfg.repetitions - 1 and self.rep > 0:
                    self._summarise_repeats(t.index)
                self._save()
                self.current = None

    def _log(self, t, layout, data, job, job_comm, indices):
        """The MLLOG of base model `job`, kept by the job's root (None elsewhere)."""
        if job is None or job_comm.rank != 0:
            return None
        from harness.mllog import BaseModelLog
        log = BaseModelLog(t.index, job)
        log.init(seed=self.seed, global_batch=t.P * t.batch, train_samples=len(indices),
                 eval_samples=data.n_val, nodes=len({self.nodes.node_of_rank[r] for r in layout.jobs[job]}),
                 per_node=self.nodes.local_size, workload=t.workload)
        return log

    def _stage(self, t, wl, data, job, job_comm, indices, log, watchdog):
        """The Data Duplicator (line 28): this job's resample copied to node-local storage.
        A failure anywhere ends the run on every rank before training (RunError)."""
        cfg, world = self.cfg, self.world
        if cfg.staging == "none":
            return None
        from harness import staging
        watchdog.beat(f"staging, test {t.index}")
        copy, err = None, None
        if job is not None:
            node = self.nodes.node_of_rank[world.rank]
            path = staging.folder(cfg.staging, os.path.basename(self.run_dir), t.index, self.rep, job, node)
            try:
                copy = staging.stage(wl, data, indices, job_comm, cfg.staging, path)
            except (staging.StagingError, OSError, ValueError) as e:  # ValueError: a DataError reading the copy
                err = str(e)
        try:
            first_failure(world, err and f"test {t.index}: {err}")
        except RunError:
            staging.cleanup(copy, keep=False)
            if job_comm is not None:
                job_comm.Free()
            raise
        if log is not None:
            log.staging(*copy.wall, copy.samples, copy.bytes)
        return copy

    def _base_model(self, t, M, wl, data, copy, job, job_comm, indices, rec, log, watchdog):
        """Train and evaluate this rank's share of base model `job`; fills `rec` and returns
        the model's score matrix on the job's root (None on its other ranks). With
        staging, the model trains and predicts from the node-local `copy`."""
        import horovod.tensorflow as hvd
        import tensorflow as tf
        from harness import ensemble, fault, flops, sampler, telemetry, train
        cfg, world = self.cfg, self.world
        root = job_comm.rank == 0
        local, local_indices = (copy.data, copy.indices) if copy else (data, indices)
        # Horovod reads its all-reduce algorithm from the environment at init
        os.environ["HOROVOD_HIERARCHICAL_ALLREDUCE"] = "1" if cfg.allreduce == "hierarchical" else "0"
        hvd.init(comm=job_comm)
        model = train.build(wl, local, self.seed, job, t.precision)
        watchdog.beat(f"training, test {t.index}")
        gpus = self.devices["gpus_on_node"]
        probe = telemetry.Sampler(gpu_index=self.nodes.local_rank % gpus if gpus else None)
        probe.start()
        recipe = train.Recipe(t.batch, cfg.epochs, cfg.base_lr, cfg.warmup_epochs, cfg.optimizer,
                              t.precision, cfg.comm_precision)
        res = train.train(wl, local, model, local_indices, recipe, seed=self.seed, job=job,
                          world_barrier=world.Barrier, hooks=_Hooks(t, len(self.tests), log, world.rank == 0),
                          on_step=_on_step(watchdog, fault.injector(world.rank)))
        rec["telemetry"] = probe.stop()
        watchdog.beat(f"evaluation, test {t.index}")
        fault.point(world.rank, "eval")
        t1 = time.perf_counter()
        rows = ensemble.my_rows(data.n_val, job_comm.rank, job_comm.size)
        full = ensemble.gather_job(job_comm, wl.predict(model, local, rows), data.n_val)
        scores = None
        if root:
            rec["quality"] = wl.quality(full, data)
            scores = ensemble.contribution(full, cfg.aggregation, job, M, ensemble.stacks(wl))
            rec.update(index_digest=sampler.digest(indices), resample_size=int(len(indices)),
                       out_of_bag=sampler.out_of_bag_fraction(indices, data.n_train))
            log.finish(rec["quality"], cfg.epochs, ok=res.weights_diff <= TOLERANCE)
            rec["mllog"] = log.lines
        if copy:
            rec["staging"] = {"seconds": copy.seconds, "writer": copy.writer, "samples": copy.samples,
                              "bytes": copy.bytes, "path": copy.path}
        rec.update(seconds=res.seconds, samples=res.samples, steps_per_epoch=res.steps_per_epoch,
                   loss=res.final_loss, diff=res.weights_diff, weights=res.weights_digest,
                   flops=flops.count(model), eval_seconds=time.perf_counter() - t1)
        hvd.shutdown()
        tf.keras.backend.clear_session()
        job_comm.Free()
        return scores

    def _result(self, t, layout, warnings, wl, data, records, total, sampler_seconds, metrics) -> dict:
        cfg = self.cfg
        roots = sorted((r for r in records if "quality" in r), key=lambda r: r["job"])
        workers = [r for r in records if r["job"] is not None]
        fc = workers[0]["flops"]
        seconds = max(r["seconds"] for r in records)
        total_flops = metrics.total_flops([r["samples"] for r in roots], fc.training)
        from harness import ensemble
        quality = wl.quality(ensemble.ensemble_scores(total, layout.M, ensemble.stacks(wl)), data)
        target = wl.TARGET_QUALITY if cfg.target_quality < 0 else cfg.target_quality
        n = wl.PENALTY_N if cfg.penalty_n < 0 else cfg.penalty_n
        fl = metrics.flops(total_flops, seconds)
        from harness import telemetry
        tele = telemetry.reduce([r["telemetry"] for r in workers])
        used = [r["rank"] for r in workers]
        max_diff = max(r["diff"] for r in workers)
        return {
            "index": t.index, "tv": t.tv(cfg), "workload": t.workload, "M": layout.M, "P": layout.P,
            "B": t.batch, "precision": t.precision, "sampler": cfg.sampler, "aggregation": cfg.aggregation,
            "repetition": self.rep, "seed": self.seed, "epochs": cfg.epochs, "jobs": [list(j) for j in layout.jobs],
            "idle_ranks": list(layout.idle), "warnings": warnings, "data": data.source,
            "train_samples": data.n_train, "val_samples": int(data.n_val),
            "forward_flops_per_sample": fc.forward, "training_flops_per_sample": fc.training,
            "flops_by_operator": fc.by_operator, "activations_per_sample": fc.activations,
            "weights": fc.weights, "intensity": metrics.intensity(fc.forward, fc.activations, fc.weights, t.batch,
                                           4 if t.precision == "fp32" else 2),
            "steps_per_epoch": [r["steps_per_epoch"] for r in roots],
            "samples_trained": int(sum(r["samples"] for r in roots)), "total_flops": total_flops,
            "train_seconds": seconds, "train_seconds_min": min(r["seconds"] for r in workers),
            "staging": _staging_summary(cfg, workers), "time_to_solution": seconds + _staging_seconds(workers),
            "eval_seconds": max(r["eval_seconds"] for r in records), "sampler_seconds": sampler_seconds,
            "flops": fl, "vflops": metrics.vflops(fl, quality, target, n),
            "quality_name": wl.QUALITY, "quality": quality, "base_quality": [r["quality"] for r in roots],
            "target_quality": target, "penalty_n": n, "penalty": metrics.penalty(quality, target, n),
            "final_loss": [r["loss"] for r in roots],
            "utilisation": _utilisation(fl, self.ceilings.get(t.precision), used),
            "telemetry": tele, "vflops_per_watt": _per_watt(metrics.vflops(fl, quality, target, n), tele),
            "consistency": {"max_diff": max_diff, "tolerance": TOLERANCE, "passed": bool(max_diff <= TOLERANCE)},
            "resample": [{"job": r["job"], "size": r["resample_size"], "out_of_bag": r["out_of_bag"],
                          "digest": r["index_digest"]} for r in roots],
            "weights_digest": [[r["weights"] for r in sorted(workers, key=lambda r: r["rank"])
                                if r["job"] == j] for j in range(layout.M)],
        }

    # -- output -----------------------------------------------------------------------
    def finish(self, interrupted: str | None = None) -> None:
        """The summary, the charts, the final results (rank 0). `interrupted` says why the
        tests stopped early (a signal); the finished tests' results stand as they are."""
        if self.world.rank != 0:
            return
        from harness import metrics, report
        with self.lock:
            if self.meta["status"] != "running":  # a signal after the normal end
                return
            self.meta["status"] = "interrupted" if interrupted else "complete"
            if interrupted:
                self.meta["interrupted"] = {"reason": interrupted, "test": self.current}
                if self.current and self.cfg.repetitions > 1:
                    self.meta["interrupted"]["repetition"] = self.rep
                self._emit(f"\nInterrupted: {interrupted}" +
                           (f" during test {self.current}; its result is lost, the finished tests' stand.\n"
                            if self.current else ".\n"))
            self._emit(report.footer(self.results, 0, report.scaling_lines(self.results, metrics.weak_scaling),
                                     bool(interrupted)))
            self._save()     # the figures first: on a signal, the launcher may kill us any moment
            self._charts()
            self._save()
        print(f"hpcai500: results in {self.run_dir}/ (report.txt, results.json)", file=sys.stderr, flush=True)

    def _header(self, dat) -> str:
        from harness import report
        return report.header(self.version, dat.TV_LEGEND, dat.describe(self.cfg), self.conventions)

    def _emit(self, text: str) -> None:
        """Append to the report; the device of lines 3-4 gets it as it grows (stdout and
        stderr at once, a file rewritten whole)."""
        self.text += text
        dev = self.cfg.device_out
        if dev in (6, 7):
            stream = sys.stdout if dev == 6 else sys.stderr
            stream.write(text)
            stream.flush()

    def _save(self) -> None:
        from harness import report
        files.atomic_write(os.path.join(self.run_dir, "report.txt"), self.text)
        files.write_json(os.path.join(self.run_dir, "results.json"), self.meta)
        if self.cfg.device_out not in (6, 7):
            files.atomic_write(self.cfg.output_file, self.text)

    def _summarise_repeats(self, index: int) -> None:
        from harness import metrics, report
        runs = [r for r in self.results if r["index"] == index]
        summary = {"index": index, **vars(metrics.repeats(runs))}
        self.meta.setdefault("repeats", []).append(summary)
        self._emit(report.repeats_block(runs[0], summary))

    def _charts(self) -> None:
        from harness import plots
        self.meta["charts"] = []
        if self.results and plots.scaling(self.results, os.path.join(self.run_dir, "scaling.png")):
            self.meta["charts"].append("scaling.png")
        for prec, ceil in self.ceilings.items():
            tests = [t for t in self.results if t["precision"] == prec]
            name = "roofline.png" if len(self.ceilings) == 1 else f"roofline-{prec}.png"
            if tests and plots.roofline(tests, ceil, os.path.join(self.run_dir, name)):
                self.meta["charts"].append(name)

    def _write_mllogs(self, t, records) -> None:
        from harness import mllog, report
        folder = os.path.join(self.run_dir, "mllog")
        os.makedirs(folder, exist_ok=True)
        for r in records:
            if "mllog" in r:
                files.atomic_write(os.path.join(folder, mllog.filename(t.index, self.rep, r["job"])),
                                    "\n".join(r["mllog"]) + "\n")


def _staging_seconds(workers) -> float:
    return max((r["staging"]["seconds"] for r in workers if "staging" in r), default=0.0)


def _staging_summary(cfg, workers) -> dict | None:
    """What the Data Duplicator did in a test: copies (one per job per node), bytes, time."""
    staged = [r["staging"] for r in workers if "staging" in r]
    if not staged:
        return None
    writers = [s for s in staged if s["writer"]]
    return {"dir": cfg.staging, "kept": cfg.staging_keep, "seconds": _staging_seconds(workers),
            "copies": len(writers), "samples": int(sum(s["samples"] for s in writers)),
            "bytes": int(sum(s["bytes"] for s in writers)),
            "paths": sorted(s["path"] for s in writers)}


class _Hooks:
    """Training-loop callbacks of one rank: MLLOG events on a job's root, progress
    lines on world rank 0 (stderr, so that stdout stays the pasteable report)."""

    def __init__(self, t, total, log, progress: bool):
        self.t, self.total, self.log, self.progress = t, total, log, progress

    def run_start(self):
        if self.log:
            self.log.run_start()

    def epoch_start(self, epoch):
        if self.log:
            self.log.epoch_start(epoch)

    def epoch_stop(self, epoch, epochs, loss, elapsed):
        if self.log:
            self.log.epoch_stop(epoch)
        if self.progress:
            t = self.t
            print(f"hpcai500: test {t.index}/{self.total} M={t.M} P={t.P} B={t.batch} : epoch {epoch}/{epochs}"
                  f"  job 0 loss {loss:.4f}  elapsed {elapsed:.1f} s", file=sys.stderr, flush=True)


def _on_step(watchdog, fire):
    """Per training step: tell the watchdog we progress; fire an injected fault if armed."""
    if fire is None:
        return lambda step: watchdog.beat()

    def on_step(step):
        watchdog.beat()
        fire(step)
    return on_step


def _option_lines(cfg) -> list[str]:
    """What the Table 2 choices of this input mean here, stated in the report."""
    lines = []
    if set(cfg.precisions) - {"fp32"}:
        lines.append("Mixed precision (fp16, bf16): Keras policy, FP32 master weights, logits/softmax/loss"
                     " in FP32, fp16 with dynamic loss scaling; FLOPs counted as for fp32")
    if cfg.comm_precision == "fp16":
        lines.append("Communication fp16: gradients cast to FP16 for the all-reduce (Horovod Compression.fp16)")
    if cfg.allreduce == "hierarchical":
        import horovod.tensorflow as hvd
        lines.append("All-reduce hierarchical: HOROVOD_HIERARCHICAL_ALLREDUCE=1; Horovod implements it with NCCL"
                     " (intra-node NCCL, inter-node MPI) " + ("and this build has NCCL" if hvd.nccl_built() else
                     "and this build has none: its flat MPI all-reduce ran"))
    if cfg.optimizer != "sgd":
        lines.append(f"Optimizer {cfg.optimizer}: see harness/optimizers.py (LARS/LAMB exclude rank <= 1 variables,"
                     " i.e. biases and batch-norm, from trust ratio and weight decay)")
    if cfg.staging != "none":
        lines.append(f"Staging to {cfg.staging}: one writer per job per node copies the job's distinct resampled"
                     " samples and the validation set, in the workload's format; the job trains from the copy."
                     " Staging time = job barrier to the end of the read-back, max over ranks; time to solution"
                     " = staging + Time (MLPerf HPC counts staging in time to train); Tflops use Time only")
    if cfg.repetitions > 1:
        lines.append(f"Repetitions: {cfg.repetitions} runs of each test with seeds {cfg.seed}..{cfg.seed + cfg.repetitions - 1};"
                     " summary = mean without the fastest and slowest run (3 or more), CV over all runs")
    return lines


def roofline_lines(c: dict) -> list[str]:
    """The conventions block's roofline lines for one precision."""
    n = len(c["per_rank"])
    lines = [f"Roofline ({c['precision']}, per rank, median of {n} ranks run at once): GEMM "
             f"{c['gemm_flops'] / 1e12:.4f} Tflops, CONV {c['conv_flops'] / 1e12:.4f} Tflops,"
             f" triad {c['bandwidth'] / 1e9:.1f} GB/s; first call excluded, median of repeats",
             "Utilisation: FLOPS / sum of the measured GEMM (and CONV) figures of the ranks the test used"]
    peak, source = c["peak"]["flops"], c["peak"]["source"]
    if peak:
        lines.append(f"Theoretical peak per rank ({source}): {peak / 1e12:.1f} Tflops;"
                     f" GEMM reaches {c['gemm_flops'] / peak:.2f} of it")
    else:
        lines.append(f"Theoretical peak per rank: {source} (set HPCAI500_PEAK_TFLOPS to give it)")
    return lines


def _utilisation(flops: float, ceil: dict | None, ranks: list[int]) -> dict | None:
    if not ceil:
        return None
    per_rank = ceil["per_rank"]
    gemm = sum(per_rank[r]["gemm"]["flops"] for r in ranks)
    conv = sum(per_rank[r]["conv"]["flops"] for r in ranks)
    peak = ceil["peak"]["flops"]
    return {"gemm": flops / gemm, "conv": flops / conv, "peak": flops / (peak * len(ranks)) if peak else None}


def _per_watt(vflops: float, tele: dict) -> float | None:
    """VFLOPS per watt (HPC AI500 V2.0), where the devices report their power."""
    from harness import telemetry
    watts = telemetry.power_watts(tele)
    return vflops / watts if watts else None


def _plain(cfg) -> dict:
    from dataclasses import asdict
    d = asdict(cfg)
    d.pop("text", None)
    return d
