"""no_failure needs positive evidence (issue 43): success lines, fatal end lines, fragments.

Every log line here is written for these tests in the formats the tools print (the sources are
named in signatures.py beside each pattern); none is copied from the corpus.
"""

from __future__ import annotations

import io
import shutil

import pytest

from gpugate.diagnosis import engine as D
from gpugate.diagnosis import verdict as V
from gpugate.hooks.child_answer import JobDiagnosis
from gpugate.hooks.exit_verdict import with_slurm_exit

ENGINES = ["python"] + (["grep"] if shutil.which("grep") else [])
PROGRESS = "".join(f" iteration {i:6d}/   90000 | lm loss: 2.41E+00 |\n" for i in range(1, 6))


def diagnose(tmp_path, text: str, engine: str = "python") -> V.Diagnosis:
    log = tmp_path / "job.log"
    log.write_text(text)
    return D.diagnose([str(log)], engine=engine)


SUCCESS_LINES = [
    "{'train_runtime': 412.7, 'train_samples_per_second': 9.1, 'epoch': 2.0}",
    "[INFO|trainer_pt_utils.py:912] 2025-01-02 03:04:05,678 >>   train_runtime            = 0:06:52.70",
    "Training completed. Do not forget to share your model on huggingface.co/models =)",
    "`Trainer.fit` stopped: `max_epochs=2` reached.",
    "[after training is done] datetime: 2025-01-02 03:04:05",
    "[2025-01-02 03:04:05,678][trainer][INFO] - [0] :: Total training time: 412.7 seconds",
    "# Out of bounds values : 0 OK",
    "# Collective test concluded: all_reduce_perf",
    "total images/sec: 1618.04",
    " busbw: 181.2210  Gbps",
    "[2025-01-02T03:04:05.678] _job_complete: JobId=81234 WEXITSTATUS 0",
    "       81234      train        gpu       proj         64  COMPLETED      0:0",
    "   JobState=COMPLETED Reason=None Dependency=(null)",
    "Hello World from rank 1 of 2",
]  # fmt: skip


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("line", SUCCESS_LINES)
def test_a_success_line_at_the_end_is_no_failure(tmp_path, engine, line):
    d = diagnose(tmp_path, PROGRESS + line + "\n", engine)
    assert (d.category, d.confidence, d.evidence) == ("no_failure", "high", ())
    assert "job.log line 6" in d.summary  # the success line is quoted


@pytest.mark.parametrize("engine", ENGINES)
def test_a_log_without_an_end_is_unknown_not_no_failure(tmp_path, engine):
    d = diagnose(tmp_path, PROGRESS, engine)
    assert (d.category, d.confidence, d.evidence, d.failing_rank) == ("unknown", "low", (), None)
    assert d.summary.startswith("The logs show neither a failure nor the run ending well")


# Lines that say a run ended badly without saying why: `other`, that line decisive, low.
END_LINES = [
    ("*** An error occurred in MPI_Init_thread", "end.mpi_abort"),
    ("*** MPI_ERRORS_ARE_FATAL (processes in this communicator will now abort,", "end.mpi_abort"),
    ("[gpu-b7:04242] Local abort before MPI_INIT completed completed successfully, but am not able",
     "end.mpi_abort"),
    ("Fatal error in PMPI_Allreduce: Other MPI error, error stack:", "end.mpi_abort"),
    ("[cli_3]: aborting job:", "end.mpi_abort"),
    ("=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES", "end.launcher"),
    ("a non-zero exit code. Per user-direction, the job has been aborted.", "end.launcher"),
    ("mpirun detected that one or more processes exited with non-zero status, thus causing",
     "end.launcher"),
    ("An internal error has occurred in ORTE:", "end.launcher"),
    ("Your job failed to map. Either no mapper was available, or none", "end.launcher"),
    ("slurmstepd: error: Failed to invoke spank plugin stack", "end.launcher"),
    ("[gpu-b7:04242] *** Process received signal ***", "end.signal"),
    ("[gpu-b7:04242] Signal: Bus error (7)", "end.signal"),
    ("[gpu-b7:04242] Signal: Segmentation fault (11)", "signal.sigsegv"),  # a known row, low too
    ("[gpu-b7:mpi_rank_3][error_sighandler] Caught error: Aborted (signal 6)", "end.signal"),
    ("terminate called after throwing an instance of 'std::runtime_error'", "end.signal"),
    ("slurmstepd: error: *** STEP 81234.0 ON gpu-b7 CANCELLED AT 2025-01-02T03:04:05 DUE TO TASK "
     "FAILURE ***", "end.slurm"),
    ("srun: error: gpu-b7: tasks 0-7: Terminated", "end.slurm"),
    ("[2025-01-02T03:04:05.678] _job_complete: JobId=81234 WEXITSTATUS 2", "end.slurm"),
    ("ERROR:tensorflow:/job:worker/task:1 encountered the following error: DeadlineExceededError()",
     "end.tf_remote"),
]  # fmt: skip


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(("line", "signature"), END_LINES, ids=[s for _, s in END_LINES])
def test_an_end_line_no_signature_explains_is_a_low_other(tmp_path, engine, line, signature):
    d = diagnose(tmp_path, PROGRESS + line + "\n", engine)
    assert (d.category, d.confidence) == ("other", "low")
    assert d.evidence[0].signature == signature and d.evidence[0].line == 6


@pytest.mark.parametrize("engine", ENGINES)
def test_an_end_line_after_the_success_line_fails_the_run(tmp_path, engine):
    text = PROGRESS + SUCCESS_LINES[0] + "\n[gpu-b7:04242] *** Process received signal ***\n"
    assert diagnose(tmp_path, text, engine).category == "other"


@pytest.mark.parametrize("engine", ENGINES)
def test_a_traceback_as_the_last_word_is_a_low_other_with_its_rank(tmp_path, engine):
    cut = PROGRESS + '[rank3]: Traceback (most recent call last):\n[rank3]:   File "t.py", line 9\n'
    d = diagnose(tmp_path, cut, engine)
    assert (d.category, d.confidence, d.failing_rank) == ("other", "low", 3)
    assert (d.evidence[0].line, d.evidence[0].signature) == (6, "python.traceback")


def test_a_traceback_before_the_success_line_was_survived(tmp_path):
    handled = 'Traceback (most recent call last):\n  File "hub.py", line 3\n' + SUCCESS_LINES[0]
    assert diagnose(tmp_path, PROGRESS + handled + "\n").category == "no_failure"
    after = SUCCESS_LINES[0] + "\nTraceback (most recent call last):\n"
    assert diagnose(tmp_path, PROGRESS + after).category == "other"


def test_a_success_line_in_one_file_outweighs_a_traceback_in_another():
    out = io.BytesIO((PROGRESS + SUCCESS_LINES[2] + "\n").encode())
    err = io.BytesIO(b'Traceback (most recent call last):\n  File "cleanup.py", line 2\n')
    inputs = [D.Input(name="job.out", source=V.JOB_FILE, stream=out),
              D.Input(name="job.err", source=V.JOB_FILE, stream=err)]  # fmt: skip
    assert D.diagnose_streams(inputs).category == "no_failure"
    # Without the success line, the traceback is the end the logs show.
    alone = [D.Input(name="job.err", source=V.JOB_FILE,
                     stream=io.BytesIO(b"Traceback (most recent call last):\n"))]  # fmt: skip
    assert D.diagnose_streams(alone).category == "other"


def test_detectron2s_total_time_is_no_success_line(tmp_path):
    # detectron2 prints it from a `finally`, after a crash too: it proves nothing.
    d = diagnose(tmp_path, PROGRESS + "Total training time: 0:40:17 (0:00:03 on hooks)\n")
    assert d.category == "unknown"


def test_a_steps_completed_row_is_not_the_jobs(tmp_path):
    d = diagnose(tmp_path, PROGRESS + "81234.0      python              proj  64  COMPLETED  0:0\n")
    assert d.category == "unknown"


@pytest.mark.parametrize(("category", "failed", "code2", "want"), [
    ("unknown", "exit code 3", "3:0", "other"),
    ("no_failure", "killed by signal 9", "0:9", "other"),
    ("unknown", None, "0:0", "no_failure"),
    ("unknown", None, None, "unknown"),  # no exit code known: no evidence either way
    ("no_failure", None, "0:0", "no_failure"),
    ("cuda_oom", "exit code 1", "1:0", "cuda_oom"),  # a named cause stays
])  # fmt: skip
def test_slurms_exit_settles_a_log_that_names_no_cause(category, failed, code2, want):
    d = with_slurm_exit(JobDiagnosis(category=category, summary="x."), failed, code2)
    assert d.category == want
    if want == "other":
        assert d.confidence == "low"
        assert (
            d.summary == f"The job failed ({failed}) and its logs name no cause. Its logs said: x."
        )


def sweep(largest: int, header: str = "# OSU MPI Bandwidth Test v7.4\n# Size      Bandwidth (MB/s)\n",
          fmt: str = "{size:<10d}{bw:>14.2f}") -> str:  # fmt: skip
    """An OSU-style table: sizes 1, 2, 4 ... `largest`, one bandwidth each."""
    rows, size = [], 1
    while size <= largest:
        rows.append(fmt.format(size=size, bw=size / 97.0))
        size *= 2
    return header + "\n".join(rows) + "\n"


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("largest", [1 << 22, 1 << 25])
def test_a_sweep_to_the_largest_size_is_a_low_no_failure(tmp_path, engine, largest):
    d = diagnose(tmp_path, sweep(largest), engine)
    assert (d.category, d.confidence) == ("no_failure", "low")
    assert f"{largest:<10d}" in d.summary and "message-size sweep" in d.summary


@pytest.mark.parametrize("engine", ENGINES)
def test_a_validated_sweep_with_labels_reads_the_same(tmp_path, engine):
    fmt = "0: {size:<10d}{bw:>14.2f}          Pass"
    d = diagnose(tmp_path, sweep(1 << 22, fmt=fmt), engine)
    assert (d.category, d.confidence) == ("no_failure", "low")


@pytest.mark.parametrize(
    "text",
    [
        sweep(1 << 20),  # osu_latency's default largest (1 MiB): not past OSU's 4 MiB default
        sweep(1 << 22, fmt="{size:<10d}{bw:>14.2f}          Fail"),  # validation failed
        sweep(1 << 22) + "iteration 5 done\n",  # something after the table
        "\n".join(f"{n:<10d}{n / 3:>14.2f}" for n in (4194304, 2097152)) + "\n",  # two rows
        "".join(f"{n:<10d}{n / 3:>14.2f}\n" for n in range(4194296, 4194305)),  # no doubling
    ],
    ids=["to-1MiB", "validation-failed", "text-after", "two-rows", "not-doubling"],
)
def test_what_is_not_a_sweep_run_through_stays_unknown(tmp_path, text):
    assert diagnose(tmp_path, text).category == "unknown"


def test_a_fatal_line_after_the_sweep_fails_the_run(tmp_path):
    end = "mpirun noticed that process rank 1 with PID 4242 on node gpu-a2 exited on signal 9 (Killed).\n"
    d = diagnose(tmp_path, sweep(1 << 22) + end)
    assert d.category == "other" and d.failing_rank == 1


@pytest.mark.parametrize("engine", ENGINES)
def test_the_tail_is_the_files_last_bytes_however_long_the_log(tmp_path, engine):
    # Over 1 MiB, so `auto` and `grep` use grep and the tail comes from a pread at the end;
    # the Python engine keeps it across its 1 MiB chunks.
    d = diagnose(tmp_path, PROGRESS * 40000 + sweep(1 << 22), engine)
    assert (d.category, d.confidence) == ("no_failure", "low")
    short = diagnose(tmp_path, sweep(1 << 22) + PROGRESS * 40000, engine)
    assert short.category == "unknown"


def test_streams_and_bytes_keep_their_tails_too():
    text = (PROGRESS * 40000 + sweep(1 << 22)).encode()
    streamed = D.diagnose_streams([D.Input(name="out", source=V.LOG_FILE, stream=io.BytesIO(text))])
    assert (streamed.category, D.diagnose_bytes(text).category) == ("no_failure", "no_failure")
