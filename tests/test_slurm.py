"""launcher=slurm against a real Slurm: a single-node cluster on localhost (tests/slurm_cluster.py,
started once for the module), each run of a sweep one job submitted with submitit."""

import json
import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml
from conftest import tiny_keys
from helpers import assert_bitwise
from slurm_cluster import LocalSlurm, available

from lbsgd import checkpoint, config
from lbsgd.lab import experiments as ex
from lbsgd.lab.studies import warmup

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    why = available()
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true: {why}")
        pytest.skip(why)
    with (
        LocalSlurm(tmp_path_factory.mktemp("slurm")) as cluster,
        pytest.MonkeyPatch.context() as mp,
    ):
        for k, v in cluster.env.items():
            if os.environ.get(k) != v:
                mp.setenv(k, v)
        yield cluster


def cluster_file(folder: Path, slurm, **keys) -> Path:
    path = folder / "here.yaml"
    base = {"partition": slurm.partition, "time_min": 10, "signal_delay_s": 30, "poll_s": 0.5}
    path.write_text(yaml.safe_dump({**base, **keys}))
    return path


def queue(slurm) -> list[str]:
    return slurm.run("squeue", "-h", "-o", "%i %j").stdout.split("\n")[:-1]


def weights(run_dir: Path) -> dict:
    return checkpoint.read(run_dir / checkpoint.NAME)["model"]


# a run of 192 steps that flushes (and may stop) every 3, long enough to be stopped mid-way
LONG = tiny_keys(epochs=24, checkpoint_every=3)


def sweep_script(out: Path, cluster: Path, keys: dict) -> str:
    return textwrap.dedent(
        f"""
        from lbsgd.lab import experiments as ex
        ex.sweep("s", [{keys!r}], out_dir={str(out)!r}, launcher="slurm", cluster={str(cluster)!r})
        """
    )


def wait_for(predicate, timeout: float = 120.0, what: str = "") -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.3)


def steps_done(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return path.read_text().count('"kind": "train"') if path.exists() else 0


def test_a_bad_cluster_file_is_one_line_before_anything_is_submitted(slurm, tmp_path):
    cases = {
        "partition": ({"partition": "nosuch"}, "partition='nosuch' is not one of"),
        "key": ({"gpus": 8}, "unknown key 'gpus'"),
        "limit": ({"time_min": 1, "signal_delay_s": 30}, "time_min=1 leaves no minute"),
        "signal": ({"signal": "HUP"}, "signal='HUP' must be one of"),
        "sbatch": ({"sbatch": {"signal": "USR1@60"}}, "sbatch's signal is the keys signal,"),
        "gpus": ({"gpus_per_node": 2}, "gpus_per_node=2: no node of partition 'debug' has as many"),
    }
    for name, (keys, words) in cases.items():
        path = cluster_file(tmp_path, slurm, **keys)
        with pytest.raises(config.ConfigError, match=words.replace("(", r"\(")) as e:
            ex.sweep(
                "s", [tiny_keys()], out_dir=tmp_path / name, launcher="slurm", cluster=str(path)
            )
        assert "\n" not in str(e.value), name
        assert not (tmp_path / name / "s").exists(), name
    with pytest.raises(config.ConfigError, match="checkpoint=false cannot run under launcher"):
        ex.sweep(
            "s",
            [tiny_keys(checkpoint=False)],
            out_dir=tmp_path / "ckpt",
            launcher="slurm",
            cluster=str(cluster_file(tmp_path, slurm)),
        )
    with pytest.raises(config.ConfigError, match="no file"):
        ex.cluster_of("nosuch", tmp_path)
    # what only sbatch knows: a node feature this cluster lacks, refused in one line naming the run
    path = cluster_file(tmp_path, slurm, constraint="nosuch")
    with pytest.raises(config.ConfigError, match="sbatch refused run resnet8-") as e:
        ex.sweep("s", [tiny_keys()], out_dir=tmp_path / "qos", launcher="slurm", cluster=str(path))
    assert "\n" not in str(e.value)
    assert queue(slurm) == []


def test_a_smoke_study_on_slurm_ends_as_it_does_locally(slurm, tmp_path):
    """Study 2 at the smoke profile: its findings, table and every run's final metrics and
    weights equal under both launchers."""
    from lbsgd.lab import studies

    path = cluster_file(tmp_path, slurm)
    out = {}
    for launcher in ("local", "slurm"):
        S = studies.start(
            "warmup",
            title=warmup.TITLE,
            profile="smoke",
            out_dir=tmp_path / launcher,
            parallel=2,
            wandb="disabled",
            launcher=launcher,
            cluster=str(path) if launcher == "slurm" else None,
        )
        df = S.sweep(warmup.runs(S.profile, S.seeds))
        out[launcher] = (df.sort_values("run").reset_index(drop=True), warmup.findings(df), S)
    (local, f_local, _), (remote, f_remote, _) = out["local"], out["slurm"]
    assert [f.to_dict() for f in f_remote] == [f.to_dict() for f in f_local]
    assert warmup.table(remote).equals(warmup.table(local))
    cols = ["run", "status", "final_top1_error_pct", "total_steps"]
    assert remote[cols].equals(local[cols])
    for a, b in zip(local["run_dir"], remote["run_dir"], strict=True):
        assert_bitwise(weights(Path(b)), weights(Path(a)))
    log = (Path(remote["run_dir"][0]).parent / f"{remote['run'][0]}.log").read_text()
    assert log.count(ex.ATTEMPT_MARK) == 1 and "Slurm job" in log


def _local_run(tmp_path: Path, keys: dict, nproc: int = 1) -> Path:
    df = ex.sweep("s", [keys], out_dir=tmp_path / "local", nproc_per_node=nproc)
    return Path(df["run_dir"][0])


def test_an_interrupted_sweep_stops_its_job_with_a_checkpoint_and_resumes_bitwise(slurm, tmp_path):
    """SIGINT to the sweep's process (Ctrl-C, Kernel > Interrupt) while its job trains: the job's
    run stops with a checkpoint, status interrupted; the same sweep again resumes it, to the
    weights of the run never interrupted."""
    path = cluster_file(tmp_path, slurm)
    out = tmp_path / "slurm"
    script = sweep_script(out, path, LONG)
    run_dir = out / "s" / config.from_dict({**LONG, "study": "s"}).run_name()
    first = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        text=True,
        # Ctrl-C's KeyboardInterrupt, even where pytest's worker ignores SIGINT (inherited)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    wait_for(lambda: steps_done(run_dir) >= 2, what="the job to train")
    first.send_signal(signal.SIGINT)
    said = first.communicate(timeout=120)[0]
    assert "interrupted at step" in said and "checkpoint kept" in said, said
    assert queue(slurm) == []
    again = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "completed" in again.stdout
    log = (out / "s" / f"{run_dir.name}.log").read_text()
    assert log.count(ex.ATTEMPT_MARK) == 2 and "resumed from its checkpoint" in log
    assert_bitwise(weights(run_dir), weights(_local_run(tmp_path, LONG)))


def test_a_preempted_job_checkpoints_is_requeued_and_resumes_bitwise(slurm, tmp_path):
    """The cluster's pre-emption signal, here USR2 (the one sbatch is asked for, as a scheduler's
    pre-emption sends it), to a running job: the trainer checkpoints, submitit requeues the job
    once it has, and the requeued job resumes the run to the uninterrupted run's weights; the
    sweep waits through it."""
    path = cluster_file(tmp_path, slurm, signal="USR2")
    out = tmp_path / "slurm"
    run_dir = out / "s" / config.from_dict({**LONG, "study": "s"}).run_name()
    sweep = subprocess.Popen(
        [sys.executable, "-c", sweep_script(out, path, LONG)], stdout=subprocess.PIPE, text=True
    )
    wait_for(lambda: steps_done(run_dir) >= 2, what="the job to train")
    jobs = out / "s" / ".slurm" / run_dir.name
    assert "#SBATCH --signal=USR2@30" in next(jobs.glob("*_submission.sh")).read_text()
    slurm.run("scancel", "--signal=USR2", (jobs / "job_id").read_text().strip())
    said = sweep.communicate(timeout=240)[0]
    assert sweep.returncode == 0, said
    log = (out / "s" / f"{run_dir.name}.log").read_text()
    assert log.count(ex.ATTEMPT_MARK) == 2 and "resumed from its checkpoint" in log, log
    assert_bitwise(weights(run_dir), weights(_local_run(tmp_path, LONG)))


@pytest.mark.timeout(400)
def test_a_real_time_limit_checkpoints_requeues_and_resumes_bitwise(slurm, tmp_path):
    """A run longer than its job's time limit (2 minutes; the signal, USR1 by default, 59 s
    before it: Slurm sends it up to 30 s earlier still): the signal arrives, the trainer
    checkpoints, submitit requeues the job, the requeued job resumes the run, and the run ends
    with the uninterrupted run's weights. The sweep says each attempt's end with its step. The
    first attempt's steps sleep (tests/slow_first_attempt.py) so that it outlasts the signal."""
    keys = {**LONG, "plugins": [str(Path(__file__).parent / "slow_first_attempt.py")]}
    path = cluster_file(tmp_path, slurm, time_min=2, signal_delay_s=59)
    out = tmp_path / "slurm"
    run_dir = out / "s" / config.from_dict({**keys, "study": "s"}).run_name()
    sweep = subprocess.Popen(
        [sys.executable, "-c", sweep_script(out, path, keys)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "SLOW_STEP_S": "0.4"},  # 192 steps: 77 s, past any signal
    )
    reference = _local_run(tmp_path, keys)  # meanwhile, at full speed
    said = sweep.communicate(timeout=360)[0]
    assert sweep.returncode == 0, said
    jobs = out / "s" / ".slurm" / run_dir.name
    assert "#SBATCH --signal=USR1@59" in next(jobs.glob("*_submission.sh")).read_text()
    (requeued,) = [ln for ln in said.splitlines() if "requeued, interrupted at step" in ln]
    step = int(requeued.split("at step ")[1].split(",")[0])
    assert 0 < step < 192 and requeued.endswith(
        "checkpoint kept (Slurm job " + jobs.joinpath("job_id").read_text().strip() + ")"
    ), said
    assert said.count("running on localhost") == 2 and "completed in" in said, said
    log = (out / "s" / f"{run_dir.name}.log").read_text()
    assert log.count(ex.ATTEMPT_MARK) == 2, log
    assert f"resumed from its checkpoint (the last attempt reached step {step}" in log, log
    assert_bitwise(weights(run_dir), weights(reference))


def test_a_run_that_fails_on_the_node_fails_its_job_with_the_nodes_error_line(slurm, tmp_path):
    """A run whose trainer fails on the node ends its job FAILED (as Slurm says it), with the
    error line of the run's log; a node whose Python cannot start the job (no submitit there)
    names the line of submitit's log that says why, and that log."""
    if (
        os.path.exists("/usr/bin/python3")
        and subprocess.run(
            ["/usr/bin/python3", "-c", "import submitit"], capture_output=True
        ).returncode
        == 0
    ):
        pytest.skip("/usr/bin/python3 has submitit: no node Python without it here")
    plugin = tmp_path / "on_the_node.py"
    plugin.write_text(
        "import os, sys\n"  # in the trainer on the node, not in submitit's process before it
        "if 'SLURM_JOB_ID' in os.environ and 'submitit' not in sys.argv[0]:\n"
        "    raise RuntimeError('no GPU driver here')\n"
    )
    keys = tiny_keys(plugins=[str(plugin)])
    out = tmp_path / "trainer"
    with pytest.raises(ex.RunFailed) as e:
        ex.sweep(
            "s", [keys], out_dir=out, launcher="slurm", cluster=str(cluster_file(tmp_path, slurm))
        )
    name = config.from_dict({**keys, "study": "s"}).run_name()
    job_id = (out / "s" / ".slurm" / name / "job_id").read_text().strip()
    assert (
        f"(Slurm job {job_id} FAILED); log: {out / 's' / name}.log; error: lbsgd: error: plugins: importing"
        in str(e.value)
    )
    assert str(e.value).endswith("raised RuntimeError: no GPU driver here")
    out = tmp_path / "python"
    path = cluster_file(tmp_path, slurm, python="/usr/bin/python3")
    with pytest.raises(ex.RunFailed) as e:
        ex.sweep("s", [tiny_keys()], out_dir=out, launcher="slurm", cluster=str(path))
    name = config.from_dict({**tiny_keys(), "study": "s"}).run_name()
    job_id = (out / "s" / ".slurm" / name / "job_id").read_text().strip()
    assert not (out / "s" / f"{name}.log").exists()
    assert (
        f"(Slurm job {job_id} FAILED); log: {out / 's' / '.slurm' / name / job_id}_0_log.out; error: "
        in str(e.value)
    )
    assert str(e.value).endswith("No module named 'submitit')"), str(e.value)


def test_a_pending_job_says_slurms_reason_and_holds_back_its_run_folder_only(slurm, tmp_path):
    """A job held in the queue is said pending with Slurm's reason; the same run of another
    out_dir (another job name) runs meanwhile: singleton holds back one run folder's jobs, not
    the same run's of other folders."""
    held = cluster_file(tmp_path, slurm, sbatch={"hold": True})
    first = subprocess.Popen(
        [sys.executable, "-c", sweep_script(tmp_path / "a", held, tiny_keys())],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    wait_for(lambda: len(queue(slurm)) == 1, what="the held job")
    free = cluster_file(tmp_path, slurm)  # over the held one: its sweep has read it
    df = ex.sweep("s", [tiny_keys()], out_dir=tmp_path / "b", launcher="slurm", cluster=str(free))
    assert list(df["status"]) == ["completed"]
    first.send_signal(signal.SIGINT)
    said = first.communicate(timeout=60)[0]
    assert "pending (JobHeldUser) (Slurm job" in said, said
    assert queue(slurm) == []


def test_a_sweep_hung_up_leaves_its_job_running_and_again_attaches_to_it(slurm, tmp_path):
    """SIGHUP to the sweep's process (its terminal or SSH session closed) while its job trains:
    the sweep says where the job is and ends; the job goes on, and the same sweep started again
    attaches to it by the recorded job id: one job, one attempt."""
    path = cluster_file(tmp_path, slurm)
    out = tmp_path / "slurm"
    script = sweep_script(out, path, LONG)
    run_dir = out / "s" / config.from_dict({**LONG, "study": "s"}).run_name()
    first = subprocess.Popen(  # SIGHUP as a terminal's command has it (not nohup's, inherited)
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL),
    )
    wait_for(lambda: steps_done(run_dir) >= 1, what="the job to train")
    first.send_signal(signal.SIGHUP)
    said = first.communicate(timeout=30)[0]
    job_id = (out / "s" / ".slurm" / run_dir.name / "job_id").read_text().strip()
    assert f"left running as Slurm job {job_id}" in said, said
    assert f"{job_id} " in " ".join(queue(slurm)) and steps_done(run_dir) < 192
    again = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"attached to Slurm job {job_id}" in again.stdout
    assert (out / "s" / ".slurm" / run_dir.name / "job_id").read_text().strip() == job_id
    log = (out / "s" / f"{run_dir.name}.log").read_text()
    assert log.count(ex.ATTEMPT_MARK) == 1
    assert checkpoint.read(run_dir / checkpoint.NAME)["step"] == 192


def test_lbsgd_execute_whose_parent_ends_leaves_the_jobs_running(slurm, tmp_path):
    """make's recipe shell ended under lbsgd execute (a study notebook on Slurm): lbsgd execute,
    its parent gone, hangs up the sweep, which leaves its job running and ends; the job's run
    completes unwatched."""
    path = cluster_file(tmp_path, slurm)
    notebook = Path(__file__).resolve().parents[1] / "notebooks" / "02_warmup.ipynb"
    args = [sys.executable, "-m", "lbsgd", "execute", "--log-output", str(notebook)]
    args += [str(tmp_path / "out.ipynb"), "-p", "profile", "smoke", "-p", "wandb", "disabled"]
    args += ["-p", "out_dir", str(tmp_path), "-p", "launcher", "slurm", "-p", "cluster", str(path)]
    terminal = tmp_path / "terminal.txt"
    script = f"exec >{terminal} 2>&1; {shlex.join(args)}; true"  # "; true": sh waits, no exec
    shell = subprocess.Popen(["sh", "-c", script], start_new_session=True)
    study = tmp_path / "smoke" / "warmup"
    wait_for(lambda: list(study.glob(".slurm/*/job_id")), what="a job")
    job_id = next(study.glob(".slurm/*/job_id")).read_text().strip()
    shell.send_signal(signal.SIGTERM)
    shell.wait(timeout=30)
    wait_for(lambda: "lbsgd: sweep of study" in terminal.read_text(), 60, "lbsgd execute's end")
    said = terminal.read_text()
    assert f"left running as Slurm job {job_id}" in said and "detached (SIGHUP)" in said, said
    run_dir = study / next(study.glob(".slurm/*/job_id")).parent.name
    wait_for(lambda: not queue(slurm), what="the job's end")
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"


def test_a_two_task_job_trains_to_the_weights_of_two_local_processes(slurm, tmp_path):
    """Two torchrun agents as two Slurm tasks (two "nodes" on localhost, one process each, the
    rendezvous on the allocation's first host) end with the 2-process local run's weights."""
    path = cluster_file(tmp_path, slurm, tasks_per_node=2)
    keys = tiny_keys(backend="gloo")
    df = ex.sweep("s", [keys], out_dir=tmp_path / "slurm", launcher="slurm", cluster=str(path))
    run_dir = Path(df["run_dir"][0])
    assert config.read_yaml(run_dir / "config.yaml", derived=True)["world_size"] == 2
    assert_bitwise(weights(run_dir), weights(_local_run(tmp_path, keys, nproc=2)))


def test_a_run_sent_to_a_cluster_is_not_held_to_this_machines_devices():
    """A login node without a GPU submits device=cuda runs: the checks of this machine's devices
    and memory are the allocation's, not the submitter's (entry.check's here=False)."""
    import torch

    from lbsgd import entry

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: nothing to refuse here")
    cfg = config.from_dict(tiny_keys(device="cuda"))
    with pytest.raises(config.ConfigError, match="cuda"):
        entry.check(cfg, 1, 1)
    entry.check(cfg, 1, 1, here=False)


def test_a_queue_read_that_fails_keeps_the_jobs_last_states_and_says_so_once(tmp_path, monkeypatch):
    """squeue timing out on a busy controller neither ends the sweep nor makes its jobs look
    ended: the last states stand until a read succeeds, with one line when the controller stops
    answering and one when it answers again (an squeue on PATH answering in turn: the job
    pending, two time-outs, the job ended, an empty queue)."""
    from lbsgd.lab.experiments import slurm as sl

    answers = tmp_path / "answers"
    answers.write_text("0")
    script = tmp_path / "bin" / "squeue"
    script.parent.mkdir()
    script.write_text(
        "#!/bin/sh\n"
        f"n=$(cat {answers}); echo $((n + 1)) > {answers}\n"
        'case $n in 0) echo "7|PENDING||Priority";; 1|2) echo "slurm_load_jobs error: Socket '
        'timed out" >&2; exit 1;; 3) echo "7|FAILED|node1|NonZeroExitCode";; esac\n'
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")
    said = []
    q = sl.Queue(poll_s=0.0, say=said.append)
    assert q.state("7") == ("PENDING", "", "Priority")
    assert q.state("7") == q.state("7") == ("PENDING", "", "Priority")  # the failed reads
    assert said == [
        "[slurm] no answer from the controller, the jobs' last states stand: squeue --me -t all "
        "-h -o %i|%T|%N|%r: slurm_load_jobs error: Socket timed out"
    ]
    assert q.state("7") == ("FAILED", "node1", "NonZeroExitCode")
    assert said[1:] == ["[slurm] the controller answers again"]
    assert q.state("7") == (sl.GONE, "", "")  # read again: it left the queue


def test_a_cluster_file_is_checked_as_a_config_is_each_fault_one_line_naming_the_key(tmp_path):
    """A cluster's keys are typed and closed as Config's are: a bool for an integer, a number in
    setup's list, a value out of range, a signal the trainer does not stop on, an unknown key, an
    override without a value or not YAML, each refused in one line naming the key and what is valid; a file
    with overrides reads whole."""
    (tmp_path / "configs" / "cluster").mkdir(parents=True)
    (tmp_path / "configs" / "cluster" / "c.yaml").write_text("partition: gpu\nmem_gb: 64\n")
    cases = {
        "c time_min=true": "cluster 'c': time_min=True must be a valid integer",
        "c setup=[1]": "cluster 'c': setup=[1] must be a valid string",
        "c tasks_per_node=0": "cluster 'c': tasks_per_node=0 must be greater than or equal to 1",
        "c signal=HUP": "cluster 'c': signal='HUP' must be one of 'USR1' or 'USR2'",
        "c gpu=8": "cluster 'c': unknown key 'gpu' (keys: ['account', 'constraint', ",
        "c time_min": "cluster override 'time_min': write key=value",
        "c sbatch={exclusive:": "cluster override 'sbatch={exclusive:' is not valid YAML: expected the node",
    }
    for spec, words in cases.items():
        with pytest.raises(config.ConfigError) as e:
            ex.cluster_of(spec, tmp_path)
        assert str(e.value).startswith(words) and "\n" not in str(e.value), (spec, str(e.value))
    c = ex.cluster_of("c time_min=600 qos=high", tmp_path)
    assert (c.partition, c.mem_gb, c.time_min, c.qos, c.signal) == (
        "gpu",
        64.0,
        600,
        "high",
        "USR1",
    )
    assert ex.launcher_of("slurm", c) is c
