#!/usr/bin/env python3
"""The catalogue of bad input: one table, one driver.

Every row is something a user can get wrong (a deck, a token shard, a checkpoint, a command
line), a signal a scheduler sends, or a fault of the machine (a stalled or dead rank, a full or
read-only file system, exhausted memory). The driver runs the real binary under mpiexec for each
row and checks, the same way for all of them:
  - the exit status of every rank (or of the job, where an abort ends every rank at once),
  - the message: printed once (agreed by the ranks, not repeated per rank), never called an
    internal error, never a crash (std::terminate, a signal), and containing the words the row
    names: the file, the key, the value and what would be accepted,
  - loses nothing: every file that existed before the row (token shards, other runs'
    checkpoints, decks) is still there with the same bytes, and no file appears among them,
  - where the row says so: how long it took, what must not be printed (a refused run must not
    train), and what must hold afterwards (a full disk keeps the previous checkpoint).
Rows that need what the machine may refuse (mounting a tmpfs needs root) are reported as
skipped, visibly.

usage: bad_input_catalogue.py MESHTRAIN_BINARY MPIEXEC [NAME_REGEX]
"""
import atexit
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

BIN, MPIEXEC = sys.argv[1], sys.argv[2]
ONLY = re.compile(sys.argv[3]) if len(sys.argv) > 3 else None
# CTest sets the MPI launch environment (MESHTRAIN_MPI_TEST_ENV in tests/CMakeLists.txt).
ENV = dict(os.environ)
NODE = socket.gethostname()
INPUT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "input")

DECK = """
# precision-independent: refusals and their messages; bf16 on CPUs with bf16 instructions
[run]
device = "cpu"
name = "catalogue"
dir = "{dir}/run"
[model]
layers = 4
d_model = 32
heads = 4
seq_len = 16
vocab_size = 256
[data]
synthetic_bytes = 65536
val = "none"
[train]
steps = 2
global_batch = 8
micro_batch = 2
[checkpoint]
every = 2
"""


def train(*sets):
    """`train {deck}` with --set overrides."""
    args = ["train", "{deck}"]
    for s in sets:
        args += ["--set", s]
    return args


def train_moe(*sets):
    """`train {deck}` on a Llama mixture of experts, with --set overrides."""
    return train("model.family=\"llama\"", "model.feed_forward=\"moe\"", *sets)


def evaluate(checkpoint, *sets):
    return ["eval", "{deck}", "--checkpoint", checkpoint, "--set", 'data.val="synthetic"'] + \
        [a for s in sets for a in ("--set", s)]


def eval_task(task):
    """`eval {deck}` of run A's step 4 scoring the multiple-choice task file `task`."""
    return ["eval", "{deck}", "--checkpoint", "{a}/step_00000004.h5", "--task", task]


def row(kind, name, ranks, args, status, expect, **options):
    """One bad input. status: the exit status of every rank ("non-zero": of every rank that
    lived to record one); options:
    job       the job's (mpiexec's) status instead, where an abort ends every rank at once
    errors    how many error lines (default 1; None: not counted)
    needs     fixtures the row uses (FIXTURES below)
    env       extra environment; memory_kb: each rank's address-space limit (memory_above_loader_kb:
              that much above the loader's floor for this binary, fixture "loader")
    prelude   shell commands each rank's wrapper runs before starting the binary
    mpmd      one argument list per rank (an MPMD launch) instead of args
    signal    (signal, seconds): sent to every rank that long after the start
    stop_file "before": the stop file (MESHTRAIN_STOP_FILE) exists at the start; "training": it
              appears once the run has written its first checkpoint
    within    seconds the job may take (after the signal, if any)
    absent    texts that must not be printed
    then      a function(paths) returning problems with what is left on disk"""
    return dict(kind=kind, name=name, ranks=ranks, args=args, status=status, expect=expect,
                **options)


def fp8_import(variant):
    """`import` of the FP8 directory `variant` (fixture "fp8") with the deck, into the scratch run."""
    return ["import", "--format", "hf", "{fp8}/" + variant, "--deck", "{deck}", "{dir}/run/imported.h5"]


def nothing_imported(p):
    out = os.path.join(p["scratch"], "imported.h5")
    return [out + " was written"] if os.path.exists(out) else []


def unverified(checkpoint, what):
    """[] when `meshtrain inspect` verifies every checksum of the checkpoint, else the problem."""
    out = subprocess.run([BIN, "inspect", checkpoint], capture_output=True, text=True, env=ENV).stdout
    return [] if "all checksums OK" in out else ["%s does not verify:\n%s" % (what, out[-1000:])]


def nothing_prepared(p):
    """[] when the refused prepare left nothing in the scratch directory, not even a .tmp."""
    left = sorted(os.listdir(p["scratch"])) if os.path.isdir(p["scratch"]) else []
    return ["left %s in %s" % (left, p["scratch"])] if left else []


def disk_full_leaves_step_2(p):
    """After a write of step 4 failed for lack of space: step 2 is kept and verifies, no .tmp."""
    ckpts = os.path.join(p["full"], "checkpoints")
    problems = []
    left = sorted(os.listdir(ckpts)) if os.path.isdir(ckpts) else []
    if left != ["step_00000002.h5"]:
        problems.append("checkpoint.dir holds %s, expected step_00000002.h5 alone" % left)
    else:
        problems += unverified(os.path.join(ckpts, left[0]), "the kept step 2")
    shutil.rmtree(ckpts, ignore_errors=True)
    return problems


def stop_file_consumed(p):
    """The run removed the stop file it stopped on (the next run must not stop on it again)."""
    stop = os.path.join(p["scratch"], "STOP")
    return ["the stop file %s is still there" % stop] if os.path.exists(stop) else []


def stopped_with_a_checkpoint(p):
    """After a stop during training: the newest checkpoint is past step 2 and verifies."""
    ckpts = os.path.join(p["scratch"], "checkpoints")
    left = sorted(n for n in os.listdir(ckpts) if n.endswith(".h5")) if os.path.isdir(ckpts) else []
    if len(left) < 2:
        return ["expected the stop's checkpoint after step 2's, found %s" % left]
    return unverified(os.path.join(ckpts, left[-1]), "the stop's checkpoint")


NOT_TRAINED = ["step     1/"]
NO_CRASH = ["terminate called", "Segmentation", "core dumped"]
STALL = "stall:rank=1:step=2"

CATALOGUE = [
    # --- the deck: layout, keys, types, ranges, files ---------------------------------------
    row("deck", "world size", 2, train("parallel.dp=2", "parallel.tp=2"), 1,
        ["parallel.dp x tp x pp = 2 x 2 x 1 = 4 does not match the 2 ranks"]),
    row("deck", "dp auto", 4, train("parallel.tp=3"), 1,
        ["parallel.dp = \"auto\" cannot fill 4 ranks with tp x pp = 3 x 1"]),
    row("deck", "cp world size", 2, train("parallel.cp=4"), 1,
        ["parallel.dp = \"auto\" cannot fill 2 ranks with tp x pp x cp = 1 x 1 x 4 = 4"]),
    row("deck", "cp sequence chunks", 2, train("parallel.cp=2", "model.seq_len=18"), 1,
        ["parallel.cp = 2 does not divide model.seq_len = 18 into 2 x cp = 4 equal chunks"]),
    row("deck", "cp with async", 3, train("parallel.data_sync=\"async\"", "parallel.servers=1",
                                          "parallel.cp=2"), 1,
        ["parallel.cp = 2 does not combine with parallel.data_sync = \"async\""]),
    row("deck", "cp in the order", 2, train("parallel.cp=2", "parallel.order=\"tp-cp-pp\""), 1,
        ["parallel.order", "tp-cp-pp"]),
    row("deck", "document mask without an end-of-text token", 2,
        train("parallel.tp=2", "data.document_mask=true"), 1,
        ["deck.toml: data.document_mask = true needs an end-of-text token",
         "data.tokenizer = \"bytes\" (bytes) has none", "data.document_mask = false"]),
    row("deck", "moe top-k above the experts", 2,
        train("model.family=\"llama\"", "model.feed_forward=\"moe\"", "model.moe_experts=4",
              "model.moe_top_k=5"), 1,
        ["deck.toml: model.moe_top_k = 5 exceeds model.moe_experts = 4", "top_k must be 1 to 4"]),
    row("deck", "moe bias step with the softmax router", 2,
        train("model.family=\"llama\"", "model.feed_forward=\"moe\"", "model.moe_bias_update_rate=0.01"), 1,
        ["deck.toml: model.moe_bias_update_rate is given but model.moe_router is \"softmax\"",
         "set model.moe_router = \"sigmoid\", or remove it"]),
    row("deck", "ep not dividing the experts", 2,
        train("model.family=\"llama\"", "model.feed_forward=\"moe\"", "model.moe_experts=3",
              "model.moe_top_k=1", "parallel.ep=2"), 1,
        ["deck.toml: parallel.ep = 2 does not divide model.moe_experts = 3",
         "ep must be one of 1, 3"]),
    row("deck", "ep not dividing dp x cp", 2,
        train("model.family=\"llama\"", "model.feed_forward=\"moe\"", "model.moe_experts=4",
              "parallel.ep=4"), 1,
        ["deck.toml: parallel.ep = 4 does not divide dp = 2", "ep must be one of 1, 2"]),
    row("deck", "ep on a dense model", 2, train("parallel.ep=2"), 1,
        ["deck.toml: parallel.ep = 2 splits a mixture of experts' experts, but "
         "model.feed_forward is \"dense\""]),
    row("deck", "ep with uneven shares", 2,
        train("model.family=\"llama\"", "model.feed_forward=\"moe\"", "model.moe_experts=4",
              "parallel.ep=2", "parallel.balance=\"declared\"", "parallel.speeds=[1.0, 0.5]"), 1,
        ["parallel.ep = 2 does not combine with uneven data shares"]),
    row("deck", "moe capacity that never drops", 2,
        train("model.family=\"llama\"", "model.feed_forward=\"moe\"", "model.moe_capacity_factor=4.0"), 1,
        ["deck.toml: model.moe_capacity_factor = 4 lets each expert take every token",
         "set 0 for dropless, or below 4"]),
    row("deck", "moe keys on a dense model", 2, train("model.moe_experts=4"), 1,
        ["model.moe_* keys are given but model.feed_forward is \"dense\""]),
    row("deck", "moe experts of GELU", 2, train("model.feed_forward=\"moe\""), 1,
        ["model.feed_forward = \"moe\" needs model.activation = \"swiglu\"", "not \"gelu_tanh\""]),
    row("deck", "heads", 3, train("parallel.tp=3"), 1,
        ["parallel.tp = 3 does not divide model.heads = 4 (tp must be one of 1, 2, 4)"]),
    row("deck", "vocabulary", 4, train("parallel.tp=4", "model.vocab_size=258"), 1,
        ["parallel.tp = 4 does not divide model.vocab_size = 258", "pad the vocabulary"]),
    row("deck", "layers", 4, train("parallel.pp=4", "model.layers=2"), 1,
        ["model.layers = 2 is fewer than parallel.pp x virtual_stages = 4 x 1"]),
    row("deck", "batch", 4, train("train.global_batch=12"), 1,
        ["train.global_batch = 12 is not divisible by dp x micro_batch = 4 x 2 = 8"]),
    row("deck", "interleaved micro-batches", 2,
        train("parallel.pp=2", "parallel.schedule=\"interleaved\"", "parallel.virtual_stages=2",
              "train.global_batch=6"), 1,
        ["micro-batches per step", "= 3) to be a multiple of parallel.pp = 2"]),
    row("deck", "zb-h1 virtual stages", 2,
        train("parallel.pp=2", "parallel.schedule=\"zb-h1\"", "parallel.virtual_stages=2"), 1,
        ["parallel.virtual_stages = 2 needs parallel.schedule = \"interleaved\" or \"gpipe\"",
         "zb-h1 runs one chunk per rank"]),
    row("deck", "zb-v virtual stages", 2,
        train("parallel.pp=2", "parallel.schedule=\"zb-v\""), 1,
        ["parallel.schedule = \"zb-v\" needs parallel.virtual_stages = 2, not 1",
         "zb-v runs exactly two chunks per rank"]),
    row("deck", "zb-v layers", 2,
        train("parallel.pp=2", "parallel.schedule=\"zb-v\"", "parallel.virtual_stages=2",
              "model.layers=3"), 1,
        ["model.layers = 3 is fewer than parallel.pp x virtual_stages = 2 x 2"]),
    row("deck", "unknown key", 2, train("train.lr_max=1"), 1,
        ["--set train.lr_max=1: unknown key train.lr_max (did you mean train.lr?)"]),
    row("deck", "unknown section", 1, train("trian.steps=3"), 1,
        ["--set trian.steps=3: unknown section [trian] (did you mean [train]?)"]),
    row("deck", "wrong type", 2, train("model.layers=\"four\""), 1,
        ["--set model.layers=\"four\": model.layers = \"four\" is a string (expected integer from "
         "1 to 100000)"]),
    row("deck", "beyond int64", 2, train("train.steps=99999999999999999999"), 1,
        ["--set train.steps=99999999999999999999: train.steps = 99999999999999999999 is outside "
         "the 64-bit integer range (expected integer from 1 to 2147483647)"]),
    row("deck", "out of range", 2, train("train.steps=0"), 1,
        ["train.steps = 0 is out of range (expected integer from 1 to 2147483647)"]),
    row("deck", "straggler threshold", 2, train("run.straggler_threshold=1.0"), 1,
        ["run.straggler_threshold = 1.0 is out of range (expected 0 (off) or a number > 1)"]),
    row("deck", "balance choice", 1, train("parallel.balance=\"fast\""), 1,
        ["parallel.balance = \"fast\" is not a known value (expected one of \"even\", "
         "\"declared\", \"measured\")"]),
    row("deck", "speeds entry", 1, train("parallel.balance=\"declared\"", "parallel.speeds=[1,0]"), 1,
        ["parallel.speeds = [ 1, 0 ] holds a speed that is not > 0"]),
    row("deck", "speeds pattern", 1,
        train("parallel.balance=\"declared\"", "parallel.speeds=[\"gpu-*\"]"), 1,
        ["parallel.speeds", "holds \"gpu-*\", not NODE-PATTERN=SPEED"]),
    row("deck", "declared without speeds", 2, train("parallel.balance=\"declared\""), 1,
        ["parallel.balance = \"declared\" needs parallel.speeds"]),
    row("deck", "speeds without declared", 2, train("parallel.speeds=[1,0.5]"), 1,
        ["parallel.speeds is given but parallel.balance is not \"declared\""]),
    row("deck", "speeds per rank", 2, train("parallel.balance=\"declared\"", "parallel.speeds=[1,1,0.5]"), 1,
        ["parallel.speeds has 3 numbers for the 2 ranks of this job"]),
    row("deck", "uneven shares under ZeRO 3", 2, train("parallel.zero=3", "parallel.rebalance=true"), 1,
        ["parallel.zero = 3 cannot take uneven data-parallel shares", "use parallel.zero = 0 or 1"]),
    row("deck", "async without servers", 2, train("parallel.data_sync=\"async\""), 1,
        ["parallel.data_sync = \"async\" needs parallel.servers >= 1"]),
    row("deck", "servers in a sync run", 2, train("parallel.servers=1"), 1,
        ["parallel.servers = 1 is given but parallel.data_sync is \"sync\""]),
    row("deck", "staleness in a sync run", 2, train("parallel.staleness=3"), 1,
        ["parallel.staleness = 3 is given but parallel.data_sync is \"sync\""]),
    row("deck", "async with ZeRO", 2, train("parallel.data_sync=\"async\"", "parallel.servers=1",
                                             "parallel.dp=1", "parallel.zero=2"), 1,
        ["parallel.zero = 2 (parallel.data_sync = \"async\": the servers hold the optimizer state"]),
    row("deck", "servers leave no workers", 2, train("parallel.data_sync=\"async\"", "parallel.servers=2"), 1,
        ["parallel.servers = 2 leaves 0 of the 2 ranks of this job for the workers"]),
    row("deck", "staleness out of range", 1, train("parallel.staleness=-1"), 1,
        ["parallel.staleness = -1"]),
    row("deck", "bad MESHTRAIN_SLOWDOWN", 2, train(), 1,
        ['MESHTRAIN_SLOWDOWN="1:fast": factor "fast" of "1:fast" is not a number (expected '
         'RANK:FACTOR[,RANK:FACTOR...]'], env={"MESHTRAIN_SLOWDOWN": "1:fast"}, absent=["| loss "]),
    row("deck", "bad choice", 1, train("parallel.schedule=\"zigzag\""), 1,
        ["parallel.schedule = \"zigzag\" is not a known value (expected one of \"gpipe\", "
         "\"1f1b\", \"interleaved\", \"zb-h1\", \"zb-v\", \"auto\")"]),
    row("deck", "run.name dot-dot", 2, train("run.name=\"..\""), 1,
        ["run.name = \"..\" is not valid (expected letters, digits, '.', '_', '-'; not \".\" and "
         "without \"..\")"]),
    row("deck", "run.dir under a file", 2, train("run.dir=\"{deck}/run\""), 1,
        ["deck.toml: run.dir = \"{deck}/run\": cannot create the run directory: {deck} is a "
         "file, not a directory"]),
    row("deck", "missing deck", 2, ["train", "{dir}/nope.toml"], 1,
        ["{dir}/nope.toml: cannot read the input deck"]),
    row("deck", "not TOML", 2, ["train", "{broken}"], 1, ["{broken}:2: not valid TOML"],
        needs=["broken"]),
    row("deck", "a directory as the deck", 2, ["train", "{dir}"], 1,
        ["{dir}: is a directory, not an input deck (expected a TOML file"]),
    row("deck", "different overrides (MPMD)", 2, None, 1,
        ["ranks were started differently: rank 1 has --set train.steps=3 where rank 0 has --set "
         "train.steps=2 (override 1)"],
        mpmd=[train("train.steps=2"), train("train.steps=3")]),
    row("deck", "different decks (MPMD)", 2, None, 1,
        ["rank 1 was given the deck {broken}, rank 0 the deck {deck}"],
        mpmd=[["train", "{deck}"], ["train", "{broken}"]], needs=["broken"]),
    # bf16 where oneDNN has no bf16 instructions (capped here by ONEDNN_MAX_CPU_ISA, on any
    # CPU) trains, emulated, and says that fp32 is faster; "auto" would have chosen fp32.
    row("deck", "bf16 without bf16 instructions", 1, train("train.precision=\"bf16\""), 0,
        ["train.precision = \"bf16\" on a CPU without bf16 instructions", "precision bf16,"],
        errors=0, env={"ONEDNN_MAX_CPU_ISA": "avx512_core"}),
    row("deck", "auto without bf16 instructions", 1, train(), 0,
        ["precision fp32 (auto: the CPU has no bf16 instructions)"], errors=0,
        env={"ONEDNN_MAX_CPU_ISA": "avx512_core"}, absent=["emulates bf16"]),

    # --- data: token shards ----------------------------------------------------------------
    row("data", "data file missing", 2, train("data.train=\"{dir}/missing_*.bin\""), 1,
        ["missing_*.bin"]),
    row("data", "vocabulary of the data", 2, train("model.vocab_size=128"), 1,
        ["model.vocab_size = 128 is smaller than the vocabulary of data.train"]),
    row("data", "short validation shard", 2,
        train("data.train=\"{dir}/text_train.bin\"", "data.val=\"{dir}/short_val.bin\""), 1,
        ["short_val.bin: no validation samples: seq_len = 16 needs at least 17 tokens"],
        needs=["shards"]),
    row("data", "token beyond vocabulary", 2, train("data.train=\"{dir}/bad_token.bin\""), 1,
        ["bad_token.bin: token 60000 at byte offset 264 (token 100) is not below the header's "
         "vocab_size 256"], needs=["shards"], absent=NOT_TRAINED),
    row("data", "flipped token byte", 2,
        train("data.train=[\"{dir}/text_train.bin\", \"{dir}/flipped.bin\"]"), 1,
        ["flipped.bin: checksum mismatch: the token bytes at offsets 64 to",
         "write it again with `meshtrain prepare`"], needs=["shards"], absent=NOT_TRAINED),

    # --- checkpoints -----------------------------------------------------------------------
    # Run A wrote step 2 and step 4 into {a}; run B (another seed) step 2 into {b}.
    row("checkpoint", "fresh run into another run's directory", 2,
        train("checkpoint.dir=\"{a}\"", "checkpoint.resume=\"none\"", "run.seed=99",
              "checkpoint.keep=1"), 1,
        ["{a}", "step_00000002.h5", "step_00000004.h5", "checkpoint.dir",
         "checkpoint.resume = \"auto\""], needs=["run_a"], absent=NOT_TRAINED),
    row("checkpoint", "resume into another run's directory", 2,
        train("checkpoint.resume=\"{a}/step_00000002.h5\"", "checkpoint.dir=\"{b}\""), 1,
        ["{b}", "step_00000002.h5"], needs=["run_a", "run_b"], absent=["step     3/"]),
    row("checkpoint", "heads differ", 2, evaluate("{a}/step_00000004.h5", "model.heads=2"), 1,
        ["{a}/step_00000004.h5", "model.heads = 4", "model.heads = 2"], needs=["run_a"]),
    row("checkpoint", "tied embeddings differ", 2,
        evaluate("{a}/step_00000004.h5", "model.tie_embeddings=false"), 1,
        ["{a}/step_00000004.h5", "model.tie_embeddings = true", "model.tie_embeddings = false"],
        needs=["run_a"]),
    row("checkpoint", "resume with other heads", 2,
        train("checkpoint.dir=\"{a}\"", "model.heads=2", "train.steps=6"), 1,
        ["model.heads = 4", "model.heads = 2"], needs=["run_a"], absent=["step     5/"]),
    row("checkpoint", "layers differ", 2, evaluate("{a}/step_00000004.h5", "model.layers=2"), 1,
        ["model.layers = 4", "model.layers = 2"], needs=["run_a"]),
    row("checkpoint", "resume past train.steps", 2,
        train("checkpoint.dir=\"{a}\"", "train.steps=3"), 1,
        ["{a}/step_00000004.h5", "step 4", "train.steps = 3"], needs=["run_a"]),
    row("checkpoint", "truncated checkpoint", 2, evaluate("{damaged}/truncated.h5"), 1,
        ["{damaged}/truncated.h5: cannot open as an HDF5 checkpoint", "truncated file"],
        needs=["damaged"]),
    row("checkpoint", "not a checkpoint", 2,
        train("checkpoint.resume=\"{damaged}/text.h5\"", "checkpoint.dir=\"{dir}/run/c\""), 1,
        ["{damaged}/text.h5: cannot open as an HDF5 checkpoint", "file signature not found"],
        needs=["damaged"], absent=NOT_TRAINED),
    row("checkpoint", "flipped parameter byte", 2,
        train("checkpoint.resume=\"{damaged}/flipped.h5\"", "checkpoint.dir=\"{dir}/run/c\""), 1,
        ["{damaged}/flipped.h5: dataset /model/", "checksum MISMATCH", "use an older checkpoint"],
        needs=["damaged"], absent=NOT_TRAINED),
    row("checkpoint", "no such checkpoint", 2,
        train("checkpoint.resume=\"{dir}/nope.h5\""), 1,
        ["checkpoint.resume = \"{dir}/nope.h5\": no such checkpoint file (give the path of a "
         "step_*.h5, \"auto\" or \"none\")"]),
    row("checkpoint", "inspect a directory", 1, ["inspect", "{a}"], 1,
        ["{a}", "is a directory"], needs=["run_a"]),
    row("checkpoint", "checkpoint.dir under a file", 2,
        train("checkpoint.dir=\"{deck}/checkpoints\""), 1,
        ["checkpoint.dir = \"{deck}/checkpoints\""], absent=NOT_TRAINED),
    row("checkpoint", "read-only checkpoint.dir", 2, train("checkpoint.dir=\"{read_only}\""), 1,
        ["checkpoint.dir = \"{read_only}\"", "Read-only file system"], needs=["read_only"],
        absent=NOT_TRAINED),

    # --- other commands and arguments ------------------------------------------------------
    row("command", "unknown sub-command", 1, ["trian", "{deck}"], 2,
        ["unknown sub-command 'trian' (did you mean 'train'?); the sub-commands are train, "
         "prepare, bench, inspect, eval, sample, plan, diagnose, export, import, keys"]),
    row("command", "export a directory", 1, ["export", "{a}", "--format", "hf", "{dir}/run/hf"], 1,
        ["{a}", "is a directory, not a checkpoint file"], needs=["run_a"]),
    row("command", "import without config.json", 2,
        ["import", "--format", "hf", "{dir}", "--deck", "{deck}", "{dir}/run/imported.h5"], 1,
        ["{dir}/config.json: cannot read (a Hugging Face model directory holds config.json"]),
    row("command", "sample prompt longer than seq_len", 1,
        ["sample", "{deck}", "--checkpoint", "{a}/step_00000004.h5", "--prompt", "x" * 17], 1,
        ["--prompt: the prompt is 17 tokens, longer than model.seq_len = 16 (the model's context): "
         "give at most 16 tokens"], needs=["run_a"]),
    row("command", "sample --tokens -1", 1,
        ["sample", "{deck}", "--checkpoint", "{a}/step_00000004.h5", "--tokens", "-1"], 2,
        ["--tokens"], needs=["run_a"], errors=None),
    row("command", "eval --digits 18", 1,
        ["eval", "{deck}", "--checkpoint", "{a}/step_00000004.h5", "--digits", "18"], 2,
        ["--digits: Value 18 not in range 0 to 17"], needs=["run_a"]),
    row("command", "plan --world 0", 1, ["plan", "{deck}", "--world", "0"], 2,
        ["--world: 0 is not a number of ranks (expected an integer >= 1)"]),
    row("command", "plan a directory", 1, ["plan", "{dir}", "--world", "2"], 1,
        ["{dir}: is a directory, not an input deck"]),
    row("command", "prepare --val-fraction 1", 1,
        ["prepare", "--synthetic", "10000", "--out", "{dir}/run/x", "--val-fraction", "1"], 2,
        ["--val-fraction: 1 would put every token into validation and none into training "
         "(expected a fraction from 0 up to, not including, 1; 0 writes no validation shard)"]),
    row("command", "prepare --val-fraction 2", 1,
        ["prepare", "--synthetic", "10000", "--out", "{dir}/run/x", "--val-fraction", "2"], 2,
        ["--val-fraction: 2 is not a fraction from 0 up to, not including, 1"]),
    row("command", "prepare a directory", 1, ["prepare", "{dir}/", "--out", "{dir}/run/y"], 1,
        ["{dir}/: is a directory, not a text file"]),
    row("command", "prepare --out a directory", 1,
        ["prepare", "--synthetic", "10000", "--out", "{dir}/"], 2,
        ["--out {dir}/ is a directory; --out takes a file prefix"]),
    row("command", "calibrate --out a directory", 2,
        ["bench", "--suite", "calibrate", "--threads", "1", "--out", "{dir}"], 1,
        ["{dir}: is a directory; --out names the profile file to write"]),
    # Refused before anything is measured (a measurement takes well over 10 s).
    row("command", "calibrate --out in a missing directory", 2,
        ["bench", "--suite", "calibrate", "--threads", "1", "--out", "{dir}/nope/machine.toml"], 1,
        ["{dir}/nope/machine.toml: cannot write the machine profile: directory {dir}/nope does "
         "not exist"], within=10),
    row("command", "diagnose without records", 1, ["diagnose", "{damaged}"], 1,
        ["holds no readable flight records"], needs=["damaged"]),

    # --- signals ---------------------------------------------------------------------------
    # As Slurm sends it, while the ranks generate a corpus for minutes: Slurm's KillWait is 30 s.
    row("signal", "SIGTERM during start-up", 2, train("data.synthetic_bytes=2000000000"), 75,
        ["stopping during start-up on SIGTERM"], errors=0, signal=(signal.SIGTERM, 5),
        within=15),
    # The job scripts ask for a stop with a file: a stale one stops the run before any step,
    # one that appears during training stops it at the next step with a checkpoint.
    row("signal", "stop file before start-up", 2, train("train.steps=100000"), 75,
        ["stopping during start-up on the stop file {scratch}/STOP"], errors=0,
        stop_file="before", within=30, then=stop_file_consumed),
    row("signal", "stop file during training", 2, train("train.steps=100000"), 75,
        ["on the stop file {scratch}/STOP: checkpoint written"], errors=0, stop_file="training",
        within=10, then=lambda p: stop_file_consumed(p) + stopped_with_a_checkpoint(p)),
    row("command", "stop file in a missing directory", 2, train(), 1,
        ["MESHTRAIN_STOP_FILE=/nonexistent-meshtrain/STOP: the directory /nonexistent-meshtrain "
         "does not exist"], env={"MESHTRAIN_STOP_FILE": "/nonexistent-meshtrain/STOP"},
        absent=NOT_TRAINED),

    # --- faults ----------------------------------------------------------------------------
    row("fault", "diverged", 2,
        train("train.lr=1e30", "train.grad_clip=0", "train.warmup_steps=0"), 5,
        ["deck.toml: the run diverged at step ", "lower train.lr (now 1e+30, e.g. 2.5e+29)",
         "warm up: train.warmup_steps = 10 (now 0)",
         "clip gradients: train.grad_clip = 1.0 (now 0: off)"]),
    # About 6 GB of fp32 parameters against a 1.5 GB address space: an allocation fails before
    # its pages are touched, so the row costs no memory.
    row("fault", "out of memory", 1, train("model.d_model=4096", "model.layers=8"), 1,
        ["rank 0: error: out of memory", "meshtrain plan DECK --world N --memory SIZE"],
        memory_kb=1500000),
    row("fault", "disk full (1 rank)", 1, train("checkpoint.dir=\"{full}/checkpoints\"",
                                               "train.steps=4"), 1,
        ["step_00000004.h5.tmp", "MB free"], needs=["full"], absent=NO_CRASH,
        then=disk_full_leaves_step_2),
    row("fault", "disk full (2 ranks)", 2, train("checkpoint.dir=\"{full}/checkpoints\"",
                                                "train.steps=4"), 1,
        ["step_00000004.h5.tmp", "MB free"], needs=["full"], absent=NO_CRASH,
        then=disk_full_leaves_step_2),
] + [
    # A rank stalls (or dies) at step 2 in each kind of group: the job ends with the timeout
    # status within seconds of run.comm_timeout, naming the operation, the group, and the rank
    # and node that did not arrive (read from the flight records).
    row("fault", "stalled rank (%s)" % group, 2,
        train("run.comm_timeout=4", "parallel.%s=2" % group), None,
        ["did not complete within 4 s (run.comm_timeout)", "on group '%s'" % group,
         "likely cause: rank 1 (node {node})"],
        job=3, errors=None, env={"MESHTRAIN_FAULT": "stall:rank=1:step=2"}, within=4 + 20,
        absent=NO_CRASH)
    for group in ("dp", "tp", "pp")
] + [
    # A rank that dies (exits without MPI_Finalize) at step 2: the launcher ends the job at once,
    # naming it; no rank is left waiting out a timeout. (`meshtrain diagnose` names it from the
    # flight records: diagnose_test.)
    row("fault", "dead rank (%s)" % group, 2, train("run.comm_timeout=60", "parallel.%s=2" % group),
        "non-zero", ["rank 1: injected fault 'exit' at step 2"], errors=None,
        env={"MESHTRAIN_FAULT": "exit:rank=1:step=2"}, within=20, absent=NO_CRASH)
    for group in ("dp", "tp", "pp")
] + [
    # --- trust round two: deck and input validation ---
    # An integer beyond the field that holds it is refused, not narrowed to 32 bits (2^32 + 1
    # steps trained 1 step; keep = 2^32 kept 0 and deleted every checkpoint).
    row("deck", "steps beyond 32 bits", 1, train("train.steps=4294967297"), 1,
        ["--set train.steps=4294967297: train.steps = 4294967297 is out of range (expected integer "
         "from 1 to 2147483647)"], absent=NOT_TRAINED),
    row("deck", "global_batch beyond 32 bits", 1, train("train.global_batch=4294967300"), 1,
        ["train.global_batch = 4294967300 is out of range (expected integer from 1 to 2147483647)"],
        absent=NOT_TRAINED),
    row("deck", "checkpoint.keep beyond 32 bits", 1, train("checkpoint.keep=4294967296"), 1,
        ["checkpoint.keep = 4294967296 is out of range (expected integer from 1 to 2147483647)"],
        absent=NOT_TRAINED),
    row("deck", "micro_batch beyond 32 bits", 1, train("train.micro_batch=4294967298"), 1,
        ["train.micro_batch = 4294967298 is out of range (expected integer from 1 to 2147483647, "
         "or \"auto\")"], absent=NOT_TRAINED),
    # Non-finite numbers: inf passed "> 0" (eps = inf: every update zero, exit 0).
    row("deck", "infinite eps", 1, train("train.eps=inf"), 1,
        ["train.eps = inf is not a finite number (expected finite number > 0)"], absent=NOT_TRAINED),
    row("deck", "NaN timeout", 1, train("run.comm_timeout=nan"), 1,
        ["run.comm_timeout = nan is not a finite number"], absent=NOT_TRAINED),
    row("deck", "lr beyond a double", 1, train("train.lr=1e400"), 1,
        ["--set train.lr=1e400: train.lr = 1e400 is outside the range of a 64-bit float (expected "
         "finite number > 0)"], absent=NOT_TRAINED),
    row("command", "plan --memory inf", 1, ["plan", "{deck}", "--world", "1", "--memory", "inf"], 1,
        ["--memory inf: not a size a rank can have (expected a finite positive size below 8 EiB"]),
    row("command", "plan --memory 1e400GiB", 1,
        ["plan", "{deck}", "--world", "1", "--memory", "1e400GiB"], 1,
        ["--memory 1e400GiB: not a size a rank can have"]),
    row("command", "sample --temperature nan", 1,
        ["sample", "{deck}", "--checkpoint", "{dir}/nope.h5", "--temperature", "nan"], 2,
        ["--temperature: nan is not a temperature (expected a finite number from 0 to 1e6"]),
    # A NUL cut the string short for open(2) and for the message (a.bin was trained on).
    row("deck", "NUL in data.train", 1, train('data.train="{dir}/a.bin\\u0000.evil"'), 1,
        ['data.train = "{dir}/a.bin\\u0000.evil" holds a NUL character (\\u0000), which would '
         'cut it short at "{dir}/a.bin"'], absent=NOT_TRAINED),
    row("deck", "NUL in run.dir", 1, train('run.dir="{dir}/run\\u0000/x"'), 1,
        ['run.dir = "{dir}/run\\u0000/x" holds a NUL character'], absent=NOT_TRAINED),
    # A line break made one --set several TOML lines: the later keys were dropped unapplied.
    row("deck", "line break in --set", 1, train("train.steps=3\ncheckpoint.keep=1"), 1,
        ["--set train.steps=3\\u000acheckpoint.keep=1: holds a line break (expected one "
         "section.key=value on one line"], absent=NOT_TRAINED),
    # Thread counts beyond the cap (backend/thread_limit.h): 100000 segfaulted in the OpenMP
    # runtime; prepare aborted with its .tmp shards left.
    row("deck", "OMP_NUM_THREADS beyond the cap", 2, train(), 1,
        ["OMP_NUM_THREADS=100000: more threads than meshtrain runs in one process (expected an "
         "integer from 1 to 1024"], env={"OMP_NUM_THREADS": "100000"},
        absent=NOT_TRAINED + NO_CRASH),
    row("command", "OMP_NUM_THREADS beyond the cap in plan", 1,
        ["plan", "{deck}", "--world", "8", "--all", "--time", "--profile",
         os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "input", "machines",
                      "dgx-h100.toml")], 1,
        ["OMP_NUM_THREADS=100000: more threads than meshtrain runs in one process"],
        env={"OMP_NUM_THREADS": "100000"}, absent=NO_CRASH),
    row("command", "prepare --threads beyond the cap", 1,
        ["prepare", "{fifo}/text.txt", "--out", "{dir}/run/t", "--threads", "100000"], 2,
        ["--threads: 100000 is not a thread count (expected an integer from 1 to 1024)"],
        needs=["fifos"], absent=NO_CRASH),
    row("command", "plan --threads 0", 1, ["plan", "{deck}", "--world", "1", "--threads", "0"], 2,
        ["--threads: 0 is not a thread count (expected an integer from 1 to 1024)"]),
    # FIFOs (named pipes) with no writer: every reader refuses at once, where its open blocked
    # forever (and a blocked rank ignored SIGTERM).
    row("deck", "a FIFO as the deck", 2, ["train", "{fifo}/deck.toml"], 1,
        ["{fifo}/deck.toml: is a FIFO (named pipe), not an input deck (expected a TOML file"],
        needs=["fifos"], within=10),
    row("data", "a FIFO as a token shard", 2, train('data.train="{fifo}/shard.bin"'), 1,
        ["{fifo}/shard.bin: is a FIFO (named pipe), not a token shard"], needs=["fifos"],
        within=10, absent=NOT_TRAINED),
    row("data", "a FIFO as the tokenizer", 1,
        ["prepare", "{fifo}/text.txt", "--tokenizer", "{fifo}/tokenizer.json", "--out",
         "{dir}/run/t"], 1,
        ["{fifo}/tokenizer.json: is a FIFO (named pipe), not a tokenizer file"], needs=["fifos"],
        within=10),
    row("command", "prepare a FIFO", 1, ["prepare", "{fifo}/input.txt", "--out", "{dir}/run/t"], 1,
        ["{fifo}/input.txt: is a FIFO (named pipe), not a text file"], needs=["fifos"], within=10),
    # JSON Lines corpora (io/jsonl_documents.h): a bad line is named by file and line, and
    # refused unless --max-bad-lines allows it; a damaged compressed file is never a shorter
    # corpus.
    row("data", "prepare JSONL: invalid JSON", 1,
        ["prepare", "{jsonl}/invalid.jsonl", "--out", "{dir}/run/j"], 1,
        ["{jsonl}/invalid.jsonl: line 2: invalid JSON at column", "more than --max-bad-lines 0"],
        needs=["jsonl"]),
    row("data", "prepare JSONL: not an object", 1,
        ["prepare", "{jsonl}/array.jsonl", "--out", "{dir}/run/j"], 1,
        ["{jsonl}/array.jsonl: line 2: a JSON array, not an object (expected one object per "
         'line, e.g. {{"text": "..."}})'], needs=["jsonl"]),
    row("data", "prepare JSONL: missing field", 1,
        ["prepare", "{jsonl}/missing.jsonl", "--out", "{dir}/run/j"], 1,
        ['{jsonl}/missing.jsonl: line 2: no field "text" (the object has "content"; '
         "--text-field names the one holding the text)"], needs=["jsonl"]),
    row("data", "prepare JSONL: field not a string", 1,
        ["prepare", "{jsonl}/number.jsonl", "--out", "{dir}/run/j"], 1,
        ['{jsonl}/number.jsonl: line 2: field "text" is a number, not a string'],
        needs=["jsonl"]),
    row("data", "prepare JSONL: invalid UTF-8", 1,
        ["prepare", "{jsonl}/latin1.jsonl", "--out", "{dir}/run/j"], 1,
        ["{jsonl}/latin1.jsonl: line 2: invalid UTF-8 byte 0xe9 at column 14"], needs=["jsonl"]),
    row("data", "prepare JSONL: more bad lines than allowed", 1,
        ["prepare", "{jsonl}/three_bad.jsonl", "--out", "{dir}/run/j", "--max-bad-lines", "2"], 1,
        ["{jsonl}/three_bad.jsonl: line 5: ", "3 bad line(s) so far, more than --max-bad-lines 2 "
         "allows"], needs=["jsonl"]),
    row("data", "prepare JSONL: --text-field names no field", 1,
        ["prepare", "{jsonl}/good.jsonl", "--out", "{dir}/run/j", "--text-field", "body"], 1,
        ['{jsonl}/good.jsonl: line 1: no field "body" (the object has "id", "text"'],
        needs=["jsonl"]),
    row("data", "prepare JSONL: truncated .gz", 1,
        ["prepare", "{jsonl}/truncated.jsonl.gz", "--out", "{dir}/run/j"], 1,
        ["{jsonl}/truncated.jsonl.gz: the gzip data ends before its stream does: the file is "
         "truncated", "gzip -t"], needs=["jsonl"]),
    row("data", "prepare JSONL: corrupt .gz", 1,
        ["prepare", "{jsonl}/corrupt.jsonl.gz", "--out", "{dir}/run/j"], 1,
        ["{jsonl}/corrupt.jsonl.gz: corrupt gzip data: "], needs=["jsonl"]),
    row("data", "prepare JSONL: truncated .zst", 1,
        ["prepare", "{jsonl}/truncated.jsonl.zst", "--out", "{dir}/run/j"], 1,
        ["{jsonl}/truncated.jsonl.zst: the zstd data ends before its stream does: the file is "
         "truncated", "zstd -t"], needs=["jsonl"]),
    row("data", "prepare JSONL: corrupt .zst", 1,
        ["prepare", "{jsonl}/corrupt.jsonl.zst", "--out", "{dir}/run/j"], 1,
        ["{jsonl}/corrupt.jsonl.zst: corrupt zstd data: "], needs=["jsonl"]),
    row("command", "prepare JSONL: --train-tokenizer", 1,
        ["prepare", "{jsonl}/good.jsonl", "--out", "{dir}/run/j", "--train-tokenizer", "bpe:300"],
        2, ["--train-tokenizer trains on text files, and {jsonl}/good.jsonl is JSON Lines"],
        needs=["jsonl"]),
    row("command", "prepare --end-of-text with the byte tokenizer", 1,
        ["prepare", "{jsonl}/good.jsonl", "--out", "{dir}/run/j", "--end-of-text"], 2,
        ["--end-of-text: the bytes tokenizer has no end-of-text token (GPT-2's, Llama 3's and "
         "Qwen's tokenizer.json have one"], needs=["jsonl"]),
    row("checkpoint", "a FIFO as checkpoint.resume", 2,
        train('checkpoint.resume="{fifo}/step_00000002.h5"', 'checkpoint.dir="{dir}/run/c"'), 1,
        ["{fifo}/step_00000002.h5: is a FIFO (named pipe), not a checkpoint file"],
        needs=["fifos"], within=10, absent=NOT_TRAINED),
    row("checkpoint", "inspect a FIFO", 1, ["inspect", "{fifo}/step_00000002.h5"], 1,
        ["{fifo}/step_00000002.h5: is a FIFO (named pipe), not a checkpoint file"],
        needs=["fifos"], within=10),
    row("command", "plan --profile a FIFO", 1,
        ["plan", "{deck}", "--world", "1", "--time", "--profile", "{fifo}/machine.toml"], 1,
        ["{fifo}/machine.toml: is a FIFO (named pipe), not a machine profile"], needs=["fifos"],
        within=10),
    row("command", "import a FIFO config.json", 1,
        ["import", "--format", "hf", "{fifo}/hf", "--deck", "{deck}", "{dir}/run/imported.h5"], 1,
        ["{fifo}/hf/", "is a FIFO (named pipe)"], needs=["fifos"], within=10),
    # --- trust round two: untrusted files ---
    # Checkpoints and HF directories from someone else, crafted from run A's step 2
    # (fixture_untrusted): each passes every other check, and would load without its refusal.
    row("checkpoint", "external raw storage", 1, ["inspect", "{dir}/untrusted/external.h5"], 1,
        ["{dir}/untrusted/external.h5: dataset /model/h.0.ln_1.weight stores its data outside the "
         "file (external storage '{dir}/untrusted/outside.bin'); a checkpoint must hold its data "
         "inside itself"], needs=["untrusted"], absent=["checksum OK"]),
    row("checkpoint", "external raw storage (export)", 1,
        ["export", "{dir}/untrusted/external.h5", "--format", "hf", "{dir}/run/hf"], 1,
        ["{dir}/untrusted/external.h5: dataset /model/h.0.ln_1.weight stores its data outside"],
        needs=["untrusted"]),
    row("checkpoint", "external link", 2, evaluate("{dir}/untrusted/external_link.h5"), 1,
        ["{dir}/untrusted/external_link.h5: /model/h.0.ln_1.weight is an external link to "
         "'/model/h.0.ln_1.weight' in file '{a}/step_00000002.h5'"], needs=["untrusted"]),
    row("checkpoint", "soft link", 2,
        train("checkpoint.resume=\"{dir}/untrusted/soft_link.h5\"", "checkpoint.dir=\"{dir}/run/c\""), 1,
        ["{dir}/untrusted/soft_link.h5: /model/h.0.ln_1.weight is a soft link to '/model/h.0.ln_1.bias'"],
        needs=["untrusted"], absent=NOT_TRAINED),
    row("checkpoint", "virtual dataset", 2, evaluate("{dir}/untrusted/virtual.h5"), 1,
        ["{dir}/untrusted/virtual.h5: dataset /model/h.0.ln_1.weight is a virtual dataset"],
        needs=["untrusted"]),
    row("checkpoint", "compressed dataset", 2, evaluate("{dir}/untrusted/gzip.h5"), 1,
        ["{dir}/untrusted/gzip.h5: dataset /model/h.0.ln_1.weight is stored through filter "
         "'deflate'"], needs=["untrusted"]),
    row("checkpoint", "dataset declaring 1 GiB", 1, ["inspect", "{dir}/untrusted/declares.h5"], 1,
        ["{dir}/untrusted/declares.h5: dataset /model/huge declares 1073741824 bytes (268435456 "
         "elements of 4 bytes) but stores 0"], needs=["untrusted"]),
    row("checkpoint", "step beyond int", 2, evaluate("{dir}/untrusted/step.h5"), 1,
        ["{dir}/untrusted/step.h5: attribute 'step' = 4294967298 is out of range (expected 0 to "
         "2147483647"], needs=["untrusted"]),
    row("checkpoint", "world_size beyond int", 1, ["inspect", "{dir}/untrusted/world_size.h5"], 1,
        ["{dir}/untrusted/world_size.h5: attribute 'world_size' = 4294967297 is out of range"],
        needs=["untrusted"]),
    row("checkpoint", "negative second moment", 2,
        train("checkpoint.resume=\"{dir}/untrusted/moment.h5\"", "checkpoint.dir=\"{dir}/run/c\"",
              "train.steps=4"), 1,
        ["{dir}/untrusted/moment.h5: dataset /optim/h.0.ln_1.weight/exp_avg_sq holds -1 at element 3",
         "finite and >= 0"], needs=["untrusted"], absent=NOT_TRAINED + ["lower train.lr"]),
    row("command", "import over an existing file", 1,
        ["import", "--format", "hf", "{dir}/untrusted/hf", "--deck", "{deck}",
         "{dir}/untrusted/existing.h5"], 1,
        ["{dir}/untrusted/existing.h5: already exists", "--force"], needs=["untrusted"]),
    row("command", "import beside another run", 1,
        ["import", "--format", "hf", "{dir}/untrusted/hf", "--deck", "{deck}",
         "{a}/step_00000000.h5", "--force"], 1,
        ["{a} holds checkpoints of another run", "step_00000002.h5"], needs=["untrusted"]),
    row("command", "import config.json a directory", 1,
        ["import", "--format", "hf", "{dir}/untrusted/hf_config_dir", "--deck", "{deck}",
         "{dir}/run/imported.h5"], 1,
        ["{dir}/untrusted/hf_config_dir/config.json: is a directory; expected a JSON file"],
        needs=["untrusted"]),
    # --- trust round two: silent hardware faults and a chaos run ---
    row("deck", "replica check cadence", 1, train("run.replica_check_every=-1"), 1,
        ["run.replica_check_every = -1 is out of range (expected integer from 0 to 2147483647)"], absent=NOT_TRAINED),
    row("deck", "spike re-run factor", 1, train("run.rerun_spike_factor=0.5"), 1,
        ["run.rerun_spike_factor = 0.5 is out of range (expected 0 (off) or a number > 1)"],
        absent=NOT_TRAINED),
    row("deck", "bad MESHTRAIN_FAULT flip", 2, train(), 1,
        ['MESHTRAIN_FAULT: cannot parse "flip_param:rank=1"',
         "expected flip_param:rank=<r>:step=<s>[:param=<name>][:index=<i>][:bit=<b>]"],
        env={"MESHTRAIN_FAULT": "flip_param:rank=1"}, absent=["| loss "]),
    # One bit of one replica's parameter flipped after step 1: the replica check stops the job
    # (exit 6, kExitHardwareFault) naming both copies' ranks and node, before any checkpoint.
    row("fault", "corrupt replica (flip_param)", 2, train("parallel.dp=2", "run.replica_check_every=1"), 6,
        ["replica check at step 1", "ranks 0 (node {node}) and 1 (node {node}) disagree",
         "sbatch --exclude={node}"], env={"MESHTRAIN_FAULT": "flip_param:rank=1:step=1"},
        absent=NO_CRASH + ["MB/s)"]),
    # One bit of one rank's gradient flipped in step 7's first attempt: a spike, re-run, the
    # rank's gradient differs: a hardware fault on that rank alone, the step not applied.
    row("fault", "step differs on re-run (flip_grad)", 2, train("parallel.dp=2", "train.steps=8"), 6,
        ["step 7 was re-run on the same data and parameters", "different results on rank 1 (node {node}: "
         "gradient)", "the step was not applied"], env={"MESHTRAIN_FAULT": "flip_grad:rank=1:step=7"},
        absent=NO_CRASH + ["rank 0 (node"]),
    # --- trust round two: run directory, hangs and crashes ---
    # Another job holds run.dir (or checkpoint.dir): refused with the holder's node and pid
    # before anything is written there: its flight record and metrics stay as they were.
    row("run", "run.dir in use by another run", 2, train("run.dir=\"{locked}\""), 1,
        ["deck.toml: run.dir = \"{locked}\": is in use by another run ({locked}/.meshtrain.lock "
         "is locked by node {node}, pid {pid}, since ", "give this run a directory of its own"],
        needs=["locked"], absent=NOT_TRAINED),
    # Another job's run.dir as this one's checkpoint.dir: the directory is that job's either way.
    row("run", "checkpoint.dir is another run's run.dir", 2,
        train("checkpoint.dir=\"{locked}\""), 1,
        ["deck.toml: checkpoint.dir = \"{locked}\": is in use by another run ({locked}/.meshtrain.lock "
         "is locked by node {node}, pid {pid}, "], needs=["locked"], absent=NOT_TRAINED),
    row("run", "checkpoint.dir in use by another run", 2,
        train("checkpoint.dir=\"{locked_checkpoints}\""), 1,
        ["deck.toml: checkpoint.dir = \"{locked_checkpoints}\": is in use by another run "
         "({locked_checkpoints}/.meshtrain.lock is locked by node {node}, pid {pid}, "],
        needs=["locked"], absent=NOT_TRAINED),
    # Not a file where a checkpoint (or its .tmp) of this run would go: refused at start-up,
    # not at that step's rename.
    row("checkpoint", "directory named like a checkpoint", 2,
        train("checkpoint.dir=\"{named}\"", "train.steps=6"), 1,
        ["checkpoint.dir = \"{named}\": {named}/step_00000006.h5 is a directory named like a "
         "checkpoint", "remove or rename it"], needs=["named"], absent=NOT_TRAINED),
    row("checkpoint", "directory named like a checkpoint's .tmp", 2,
        train("checkpoint.dir=\"{named_tmp}\"", "train.steps=4"), 1,
        ["{named_tmp}/step_00000004.h5.tmp is a directory named like a checkpoint"],
        needs=["named"], absent=NOT_TRAINED),
    # A stop file that a run cannot remove once it stopped on it would stop every restart, and
    # the chain job requeues on exit 75 forever: refused with status 1.
    row("signal", "stop file is a directory", 2, train(), 1,
        ["MESHTRAIN_STOP_FILE=/tmp: is a directory, not a stop file", "name a path where nothing is"],
        env={"MESHTRAIN_STOP_FILE": "/tmp"}, absent=NOT_TRAINED),
    # A FIFO of the test's own rather than a device: a binary that still removed the stop file
    # it stopped on would delete /dev/null for the whole machine.
    row("signal", "stop file is a fifo", 2, train(), 1,
        ["MESHTRAIN_STOP_FILE={fifo}/input.txt: is a FIFO (named pipe), not a stop file"],
        env={"MESHTRAIN_STOP_FILE": "{fifo}/input.txt"}, needs=["fifos"], absent=NOT_TRAINED),
] + [
    # A rank stalls in the middle of writing step 2's checkpoint, before a dataset's write that
    # the others have entered: inside MPI-IO (collective) no communicator's timeout reaches them,
    # so the watchdog of blocking regions ends the job within seconds of run.comm_timeout, naming
    # the region; the flight records name the rank that never entered it.
    row("fault", "stalled rank in a checkpoint write (%s)" % name, 2,
        train("run.comm_timeout=4", "train.steps=4", *sets), None,
        ["did not complete within 4 s (run.comm_timeout)"] + expect,
        job=3, errors=None, env={"MESHTRAIN_FAULT": "checkpoint_stall:data@2:rank=1"},
        within=4 + 20, absent=NO_CRASH)
    for name, sets, expect in (
        ("collective", ["checkpoint.io=\"collective\""],
         ["collective write of dataset", "likely cause: rank 1 (node {node})"]),
        ("independent", ["checkpoint.io=\"independent\""], ["likely cause: rank 1 (node {node})"]),
        ("collective, async", ["checkpoint.io=\"collective\"", "checkpoint.async=true"],
         ["collective write of dataset"]))
] + [
    # --- trust round two: tests that hold on every CPU, and predictions a user can trust ---
    # bf16 where oneDNN has no bf16 GEMM at all (AVX2; capped here by ONEDNN_MAX_CPU_ISA on any
    # CPU): refused before the first step, on every rank alike, instead of failing inside it;
    # "auto" trains fp32 there.
    row("deck", "bf16 where oneDNN has no bf16 GEMM", 2, train("train.precision=\"bf16\""), 1,
        ["{deck}: train.precision = \"bf16\" on a CPU where oneDNN has no bf16 GEMM", "avx2",
         "AVX512_CORE", "use \"fp32\""], env={"ONEDNN_MAX_CPU_ISA": "avx2"}, absent=["| loss "]),
    row("deck", "auto where oneDNN has no bf16 GEMM", 1, train(), 0,
        ["precision fp32 (auto: the CPU has no bf16 instructions)"], errors=0,
        env={"ONEDNN_MAX_CPU_ISA": "avx2"}),
] + [
    # issue 50 (i50-tokenizer): a tokenizer.json field meshtrain does not apply is refused by name,
    # not passed over; ids are bounded by the number of tokens before anything is allocated (one
    # id of 200,000,000 in 5 kB of JSON took 32 s and 6.3 GB; one of 2^31 + 5 ended in
    # std::bad_alloc); a malformed added token is refused, not dropped (after which --end-of-text
    # said there was none).
    row("data", "tokenizer.json: %s" % name, 1,
        ["prepare", "{tokjson}/text.txt", "--tokenizer", "{tokjson}/%s.json" % name, "--out",
         "{dir}/run/tj"] + extra, 1, ["{tokjson}/%s.json: " % name + expect], needs=["tokjson"],
        within=15, absent=NO_CRASH)
    for name, extra, expect in (
        ("huge_id", [], "token \"hello\" has id 200000000, expected an id below 514 (twice the "
                        "257 tokens of the vocabulary and added tokens together)"),
        ("id_2_31", [], "token \"hello\" has id 2147483653, expected an id below 514"),
        ("ignore_merges_yes", [], "model.ignore_merges = \"yes\" is not true or false"),
        ("dropout", [], "model.dropout = 0.1 is BPE dropout, which meshtrain does not apply"),
        ("roberta", [], "post_processor.type = \"RobertaProcessing\" is a post-processor meshtrain "
                        "does not apply"),
        ("bert_normalizer", [], "normalizer.type = \"BertNormalizer\" is a normalizer meshtrain "
                                "does not apply"),
        ("added_2_40", ["--end-of-text"], "added_tokens[0].id = 1099511627776 is out of range"),
        ("added_twice", ["--end-of-text"], "added token \"<|endoftext|>\" (id 257): another added "
                                           "token has the same content (id 256)"))
] + [
    # issue 50 (i50-runtime): start-up bounded before the deck is read, memory limits, refused
    # starts that leave another run's records alone, impossible "auto" layouts, coefficients
    # --- a rank stopped before it joins MPI_Init (its wrapper stops itself before the binary
    # starts): the other waits inside MPI_Init, where run.comm_timeout cannot reach yet, and
    # MESHTRAIN_INIT_TIMEOUT ends it within seconds, naming the stage.
    row("fault", "rank stopped before MPI_Init", 2, train(), "non-zero",
        ["rank 0: error: MPI_Init on node {node} did not return within 3 s (MESHTRAIN_INIT_TIMEOUT",
         "a rank of the job has likely stalled or died before joining it"],
        env={"MESHTRAIN_INIT_TIMEOUT": "3"}, within=3 + 20, absent=NO_CRASH,
        prelude='[ "${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-0}}" = 1 ] && kill -STOP $$; '),
    # --- a low address-space limit (ulimit -v): OpenBLAS's constructor spun for ever before main
    # below about 600 MB, and a thread that could not be created was an "internal error"; now
    # out of memory (status 1) within seconds at every limit the dynamic loader gets past. The
    # limits are taken above the loader's own floor for this binary (fixture "loader": 150 MB
    # without the CUDA backend, about 1 GB with cuBLAS, cuDNN and NCCL linked), and below what
    # start-up needs with one thread (384 MiB beside the program): a limit just above that can
    # still end in a crash inside oneDNN when an allocation fails (seen at the floor + 400 MB),
    # which this catalogue does not yet hold.
] + [
    row("fault", "address space limited to the loader's floor + %d MB" % (mb), 1, train(), 1,
        ["rank 0: error: out of memory", "memory-and-planning.md"], memory_above_loader_kb=mb * 1000,
        within=15, absent=NO_CRASH + NOT_TRAINED, needs=["loader"])
    for mb in (10, 100, 200, 300)
] + [
    row("command", "MESHTRAIN_INIT_TIMEOUT not a number", 2, train(), 1,
        ["MESHTRAIN_INIT_TIMEOUT=soon is not a number of seconds (expected a finite number >= 0"],
        env={"MESHTRAIN_INIT_TIMEOUT": "soon"}, absent=NOT_TRAINED),
    # --- a start refused in the directory of a run that ended (not locked: nothing else stops
    # it) must leave that run's flight records, which diagnose reads after a crash, as they were.
    row("run", "refused start keeps the last run's flight records", 2,
        train("run.dir=\"{dir}/a\"", "checkpoint.dir=\"{dir}/run/c\"",
              "checkpoint.resume=\"{dir}/damaged/text.h5\""), 1,
        ["{dir}/damaged/text.h5"], needs=["damaged"], absent=NOT_TRAINED),
    # --- "auto" layout keys that no layout satisfies: refused at once, before a machine profile
    # is measured (seconds) or a layout timed, naming the keys and what would divide.
    row("deck", "dp and ep auto with an indivisible batch", 2,
        train("model.feed_forward=\"moe\"", "model.activation=\"swiglu\"", "model.bias=false",
              "model.moe_experts=4", "parallel.dp=\"auto\"",
              "parallel.ep=\"auto\"", "train.global_batch=3", "train.micro_batch=1"), 1,
        ["{deck}: parallel.dp = \"auto\", parallel.ep = \"auto\" leave no valid layout of 2 ranks",
         "train.global_batch = 3 is not divisible by dp x micro_batch = 2 x 1 = 2 (global_batch "
         "must be a multiple of 2, e.g. 4)"], within=10, absent=NOT_TRAINED + ["measured"]),
    # --- plan --time of a layout over the profile's memory per rank (Megatron's 1T layout with
    # ZeRO 0 and no recomputation on the DGX A100 profile): said before the times, not a bare MFU.
    row("command", "plan --time of a layout that does not fit", 1,
        ["plan", os.path.join(INPUT, "gpt3-175b.toml"), "--world", "3072", "--device", "cuda",
         "--set", "model.layers=128", "--set", "model.d_model=25600", "--set", "model.heads=160",
         "--set", "parallel.pp=64", "--set", "train.global_batch=3072", "--set",
         "parallel.recompute=\"none\"", "--set", "parallel.virtual_stages=1", "--set",
         "parallel.schedule=\"1f1b\"", "--set", "parallel.zero=0", "--time", "--profile",
         os.path.join(INPUT, "machines", "dgx-a100-80gb.toml")], 0,
        ["# does not fit: 103.67 GiB > 80.00 GiB per rank (the profile's memory_per_rank): this "
         "layout cannot run on dgx-a100-80gb", "(datasheet, ", "): does not fit, "], errors=0),
    row("deck", "moe_aux_loss 1e300", 1,
        train("model.feed_forward=\"moe\"", "model.activation=\"swiglu\"", "model.moe_experts=4",
              "model.moe_aux_loss=1e300"), 1,
        ["--set model.moe_aux_loss=1e300: model.moe_aux_loss = ",
         "is out of range (expected finite number from 0 to 1)"],
        absent=NOT_TRAINED + ["lower train.lr"]),
    # issue 50 (i50-export): export writes the tokenizer files the command line names (a path a
    # checkpoint records is never opened); one that is not a tokenizer.json is refused before
    # OUT is touched.
    row("command", "export --tokenizer missing", 1,
        ["export", "{a}/step_00000002.h5", "--format", "hf", "{dir}/run/hf", "--tokenizer",
         "{dir}/no_such/tokenizer.json"], 1,
        ["{dir}/no_such/tokenizer.json: cannot read (--tokenizer: a Hugging Face tokenizer.json)"],
        needs=["run_a"], then=lambda p: ["{scratch}/hf was written".format(**p)]
        if os.path.exists(os.path.join(p["scratch"], "hf")) else []),
    row("command", "export --tokenizer a FIFO", 1,
        ["export", "{a}/step_00000002.h5", "--format", "hf", "{dir}/run/hf", "--tokenizer",
         "{fifo}/tokenizer.json"], 1,
        ["{fifo}/tokenizer.json: is a FIFO (named pipe), not a regular file; expected a JSON file"],
        needs=["run_a", "fifos"], within=20),
    # issue 50 (i50-import): import's outputs checked before anything is written, and the
    # directory lock of a running job's checkpoint.dir.
    row("command", "import --deck-out naming the checkpoint", 1,
        ["import", "--format", "hf", "{dir}/untrusted/hf", "{dir}/imported.h5", "--deck-out",
         "{dir}/untrusted/../imported.h5"], 1,
        ["{dir}/untrusted/../imported.h5 (--deck-out) is the same file as {dir}/imported.h5 (the checkpoint"],
        needs=["untrusted"]),
    row("command", "import into a locked checkpoint.dir", 1,
        ["import", "--format", "hf", "{dir}/untrusted/hf", "--deck", "{deck}",
         "{locked_checkpoints}/step_00000000.h5"], 1,
        ["{locked_checkpoints}/step_00000000.h5: its directory {locked_checkpoints} is in use by another run "
         "({locked_checkpoints}/.meshtrain.lock is locked by node {node}, pid {pid}, "],
        needs=["untrusted", "locked"]),
    # issue 50 (i50-jsonl): prepare's JSON Lines bounds and its outputs. A number no double holds
    # is a bad line (was an internal error); a line longer than --max-line-bytes is a bad line,
    # read through without being held; a file of blank lines is no corpus (was empty shards,
    # exit 0); negative or huge counts name the flag and the range (was 1.8e308's 309 digits);
    # existing shards are replaced only with --force, an input never.
    row("data", "prepare JSONL: a number beyond a double", 1,
        ["prepare", "{jsonl50}/overflow.jsonl", "--out", "{dir}/run/j"], 1,
        ["{jsonl50}/overflow.jsonl: line 2: a number beyond the range of a double: 1e400",
         "more than --max-bad-lines 0"], needs=["jsonl50"], then=nothing_prepared),
    row("data", "prepare JSONL: a line beyond --max-line-bytes", 1,
        ["prepare", "{jsonl50}/long_line.jsonl", "--out", "{dir}/run/j", "--max-line-bytes",
         "1000"], 1,
        ["{jsonl50}/long_line.jsonl: line 2: the line is 5012 bytes long, more than "
         "--max-line-bytes 1000 bytes allows", "more than --max-bad-lines 0"],
        needs=["jsonl50"], then=nothing_prepared),
    row("data", "prepare JSONL: blank lines only", 1,
        ["prepare", "{jsonl50}/blank.jsonl", "--out", "{dir}/run/j"], 1,
        ["{jsonl50}/blank.jsonl: holds no document: its 3 line(s) are all blank"],
        needs=["jsonl50"], then=nothing_prepared),
    row("command", "prepare --max-bad-lines -1", 1,
        ["prepare", "{jsonl50}/overflow.jsonl", "--out", "{dir}/run/j", "--max-bad-lines", "-1"], 2,
        ["--max-bad-lines -1 is out of range (expected an integer from 0 to 9223372036854775807"],
        needs=["jsonl50"], absent=["1797693134862315"], then=nothing_prepared),
    row("command", "prepare --max-bad-lines beyond int64", 1,
        ["prepare", "{jsonl50}/overflow.jsonl", "--out", "{dir}/run/j", "--max-bad-lines",
         "99999999999999999999"], 2,
        ["--max-bad-lines 99999999999999999999 is out of range (expected an integer from 0 to"],
        needs=["jsonl50"], absent=["1797693134862315"], then=nothing_prepared),
    row("command", "prepare --max-line-bytes 0", 1,
        ["prepare", "{jsonl50}/overflow.jsonl", "--out", "{dir}/run/j", "--max-line-bytes", "0"],
        2, ["--max-line-bytes 0 is out of range (expected an integer from 1 to 4294967296"],
        needs=["jsonl50"], then=nothing_prepared),
    row("data", "prepare over existing shards", 1,
        ["prepare", "{jsonl50}/good.jsonl", "--out", "{jsonl50}/done"], 1,
        ["{jsonl50}/done_train.bin: exists; prepare never replaces an output unless told to",
         "--force"], needs=["jsonl50"]),
    row("data", "prepare --force over its own input", 1,
        ["prepare", "{jsonl50}/done_train.bin", "--out", "{jsonl50}/done", "--force"], 1,
        ["{jsonl50}/done_train.bin: is an input of this prepare", "--force never replaces an input"],
        needs=["jsonl50"]),
    # issue 53 (dsv3fam): FP8 block-scaled import (families/hf/hf_fp8.h). Any quantization but
    # quant_method "fp8" / fmt "e4m3" / a [rows, cols] block is refused by key; each F8_E4M3 weight
    # needs its weight_scale_inv of the ceil grid's shape, a scale its F8 weight; NaN codes and
    # F8_E5M2 are refused by tensor. Nothing is written.
    row("command", "import FP8: quant_method gptq", 1, fp8_import("gptq"), 1,
        ['{fp8}/gptq/config.json: quantization_config.quant_method = "gptq" (meshtrain imports bf16, fp16 '
         'or fp32 weights, or fp8 e4m3 block-scaled ones: quant_method "fp8", fmt "e4m3", weight_block_size '
         '[rows, cols]; gptq is not supported)'], needs=["fp8"], then=nothing_imported),
    row("command", "import FP8: quant_method compressed-tensors", 1, fp8_import("compressed"), 1,
        ['{fp8}/compressed/config.json: quantization_config.quant_method = "compressed-tensors" (',
         "compressed-tensors is not supported)"], needs=["fp8"], then=nothing_imported),
    row("command", "import FP8: fmt e5m2", 1, fp8_import("e5m2"), 1,
        ['{fp8}/e5m2/config.json: quantization_config.fmt = "e5m2" (meshtrain dequantizes fp8 e4m3 (OCP '
         'e4m3fn) weights only'], needs=["fp8"], then=nothing_imported),
    row("command", "import FP8: one-element weight_block_size", 1, fp8_import("block"), 1,
        ["{fp8}/block/config.json: quantization_config.weight_block_size = [128] (expected two integers >= 1, "
         "the rows and columns one scale covers"], needs=["fp8"], then=nothing_imported),
    row("command", "import FP8: weight without its scale", 1, fp8_import("no_scale"), 1,
        ["{fp8}/no_scale/model.safetensors: tensor transformer.h.0.mlp.c_fc.weight is F8_E4M3, but its scale "
         "transformer.h.0.mlp.c_fc.weight_scale_inv is missing (expected F32 of shape (2, 3): one per block of "
         "{fp8}/no_scale/config.json's weight_block_size [16, 48])"], needs=["fp8"], then=nothing_imported),
    row("command", "import FP8: scale of the floor grid", 1, fp8_import("floor"), 1,
        ["{fp8}/floor/model.safetensors: tensor transformer.h.0.mlp.c_fc.weight_scale_inv is F32 of shape "
         "(2, 2), but transformer.h.0.mlp.c_fc.weight (32, 128) with weight_block_size [16, 48] needs F32, "
         "BF16 or F16 of shape (2, 3)"], needs=["fp8"], then=nothing_imported),
    row("command", "import FP8: scale of an F32 weight", 1, fp8_import("orphan"), 1,
        ["{fp8}/orphan/model.safetensors: tensor transformer.h.0.mlp.c_proj.weight_scale_inv is a block "
         "scale, but its weight transformer.h.0.mlp.c_proj.weight is F32, not F8_E4M3"], needs=["fp8"],
        then=nothing_imported),
    row("command", "import FP8: scale without a weight", 1, fp8_import("stray"), 1,
        ["{fp8}/stray/model.safetensors: tensor transformer.h.9.mlp.c_fc.weight_scale_inv is a block scale, "
         "but its weight transformer.h.9.mlp.c_fc.weight is not in the directory"], needs=["fp8"],
        then=nothing_imported),
    row("command", "import FP8: NaN code", 1, fp8_import("nan"), 1,
        ["{fp8}/nan/model.safetensors: tensor transformer.h.0.mlp.c_fc.weight holds the NaN code 0x7F at "
         "element 5 (index [0, 5])"], needs=["fp8"], then=nothing_imported),
    row("command", "import FP8: F8 weights without quantization_config", 1, fp8_import("unscaled"), 1,
        ["{fp8}/unscaled/model.safetensors: tensor transformer.h.0.mlp.c_fc.weight is F8_E4M3, but "
         "{fp8}/unscaled/config.json has no quantization_config"], needs=["fp8"], then=nothing_imported),
    row("command", "import FP8: F8_E5M2 tensor", 1, fp8_import("f8_e5m2"), 1,
        ["{fp8}/f8_e5m2/model.safetensors: tensor 'transformer.h.0.mlp.c_fc.weight' has dtype \"F8_E5M2\", "
         "which this reader does not accept (accepted: F32, F16, BF16 or F8_E4M3)"], needs=["fp8"],
        then=nothing_imported),
    # issue 53 (yarn): YaRN's rotary keys and group-limited routing's, refused by key and value
    # with what would be accepted.
    row("deck", "yarn beta_fast not above beta_slow", 2,
        train("model.family=\"qwen3\"", "model.rope_scaling=\"yarn\"", "model.rope_beta_fast=1.0"), 1,
        ["deck.toml: model.rope_*: rotary embedding: rope_scaling.beta_fast = 1 is not accepted (a "
         "number of turns above beta_slow 1, e.g. 32)"]),
    row("deck", "yarn factor below 1", 2,
        train("model.family=\"llama\"", "model.rope_scaling=\"yarn\"", "model.rope_factor=0.5"), 1,
        ["deck.toml: model.rope_*: rotary embedding: rope_scaling.factor = 0.5 is not accepted (YaRN "
         "stretches the context by a number >= 1"]),
    row("deck", "moe groups with the softmax router", 2,
        train_moe("model.moe_experts=8", "model.moe_groups=4", "model.moe_top_groups=2"), 1,
        ["deck.toml: model.moe_groups = 4 with model.moe_router = \"softmax\"",
         "set model.moe_router = \"sigmoid\", or moe_groups = 1"]),
    row("deck", "moe top groups holding fewer experts than top_k", 2, train_moe(
        "model.moe_router=\"sigmoid\"", "model.moe_experts=8", "model.moe_groups=4", "model.moe_top_k=3"), 1,
        ["deck.toml: model.moe_top_groups = 1 leaves 2 experts to choose from, fewer than model.moe_top_k = 3"]),
    # issue 54 (muon): train.optimizer and Muon's keys; the layouts Muon does not run on yet
    # (parameter servers, offload) are refused naming the key; a checkpoint's optimizer
    # state resumes only under its own optimizer, both named.
    row("deck", "train.optimizer unknown", 1, train("train.optimizer=\"sgd\""), 1,
        ["train.optimizer = \"sgd\" is not a known value (expected one of \"adamw\", \"muon\")"]),
    row("deck", "muon momentum out of range", 1,
        train("train.optimizer=\"muon\"", "train.muon_momentum=1.0"), 1,
        ["train.muon_momentum = 1.0 is out of range (expected finite number from 0 to 0.999)"]),
    row("deck", "muon keys under adamw", 1, train("train.muon_ns_steps=3"), 1,
        ["train.muon_* keys are given but train.optimizer is \"adamw\", so they would be ignored"]),
    row("deck", "muon with parameter servers", 3,
        train("train.optimizer=\"muon\"", "parallel.data_sync=\"async\"", "parallel.servers=1"), 1,
        ["parallel.data_sync = \"async\" with train.optimizer = \"muon\""], absent=NOT_TRAINED),
    row("checkpoint", "resume AdamW's state with muon", 2,
        train("checkpoint.dir=\"{a}\"", "train.optimizer=\"muon\"", "train.steps=6"), 1,
        ["{a}/step_00000004.h5: its optimizer state is train.optimizer = \"adamw\"'s",
         "has train.optimizer = \"muon\"", "set train.optimizer = \"adamw\" to resume it"],
        needs=["run_a"], absent=["step     5/"]),
    row("checkpoint", "resume Muon's state with adamw", 2,
        train("checkpoint.resume=\"{dir}/muon/checkpoints/step_00000002.h5\"",
              "checkpoint.dir=\"{dir}/run/c\"", "train.steps=4"), 1,
        ["step_00000002.h5: its optimizer state is train.optimizer = \"muon\"'s",
         "has train.optimizer = \"adamw\"", "set train.optimizer = \"muon\" to resume it"],
        needs=["run_muon"], absent=["step     3/"]),
    # issue 53 (mla): latent attention's deck keys are refused by name where they would be
    # ignored or where the attention is not built for them.
    row("deck", "latent attention keys with standard attention", 1,
        train("model.family=\"llama\"", "model.kv_lora_rank=64"), 1,
        ["deck.toml: model.q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim or "
         "v_head_dim is given but model.attention is \"standard\"", "set model.attention = \"latent\""]),
    row("deck", "latent attention with learned positions", 1,
        train("model.bias=false", "model.attention=\"latent\""), 1,
        ["deck.toml: model.attention = \"latent\" needs model.positions = \"rotary\", not \"learned\""]),
    row("deck", "latent attention with kv_heads", 1,
        train("model.family=\"llama\"", "model.attention=\"latent\"", "model.kv_heads=2"), 1,
        ["deck.toml: model.attention = \"latent\" needs model.kv_heads = heads = 4, not 2",
         "remove model.kv_heads"]),
    row("deck", "latent attention with a bias", 1,
        train("model.family=\"llama\"", "model.attention=\"latent\"", "model.bias=true"), 1,
        ["deck.toml: model.attention = \"latent\" needs model.bias = false",
         "attention_bias = true is not supported"]),
    row("deck", "latent attention with qk_norm", 1,
        train("model.family=\"qwen3\"", "model.attention=\"latent\""), 1,
        ["deck.toml: model.attention = \"latent\" needs model.qk_norm = false"]),
    row("deck", "latent attention with an odd rotary part", 1,
        train("model.family=\"llama\"", "model.attention=\"latent\"", "model.qk_rope_head_dim=5"), 1,
        ["deck.toml: model.positions = \"rotary\" needs an even qk_rope_head_dim, not 5"]),
    row("deck", "latent attention with a zero kv_lora_rank", 1,
        train("model.family=\"llama\"", "model.attention=\"latent\"", "model.kv_lora_rank=0"), 1,
        ["model.kv_lora_rank", "0"]),
    # issue 53 (dsv3fam2): a DeepseekV3ForCausalLM config.json is refused by key where meshtrain
    # computes something else (families/deepseek_v3/hf_deepseek_v3.h), before any weight is read.
    row("command", "import DeepSeek-V3: scoring_func softmax", 1,
        ["import", "--format", "hf", "{dsv3}/softmax", "{dir}/run/imported.h5"], 1,
        ['{dsv3}/softmax/config.json: scoring_func = "softmax" (meshtrain accepts "sigmoid": '
         "DeepSeek-V3's sigmoid router)"], needs=["dsv3"], then=nothing_imported),
    row("command", "import DeepSeek-V3: grouped key/value heads", 1,
        ["import", "--format", "hf", "{dsv3}/kv_heads", "{dir}/run/imported.h5"], 1,
        ["{dsv3}/kv_heads/config.json: num_key_value_heads = 2 (meshtrain accepts num_attention_heads = 4"],
        needs=["dsv3"], then=nothing_imported),
    # issue 53 (dsv3hf): the routers' e_score_correction_bias is read into the expert bias
    # (HfFormat::state_tensors): its shape and dtype checked, and one on a dense block refused by name.
    row("command", "import DeepSeek-V3: router bias of another shape", 1,
        ["import", "--format", "hf", "{dsv3w}/bias_shape", "{dir}/run/imported.h5"], 1,
        ["{dsv3w}/bias_shape/model.safetensors: tensor model.layers.1.mlp.gate.e_score_correction_bias has "
         "shape (7,), but the deck's model", "needs (8,)"], needs=["dsv3w"], then=nothing_imported),
    row("command", "import DeepSeek-V3: router bias stored as FP8", 1,
        ["import", "--format", "hf", "{dsv3w}/bias_fp8", "{dir}/run/imported.h5"], 1,
        ["{dsv3w}/bias_fp8/model.safetensors: tensor model.layers.2.mlp.gate.e_score_correction_bias is "
         "stored as F8_E4M3, but it is the router's balancing bias", "accepted: F32"],
        needs=["dsv3w"], then=nothing_imported),
    row("command", "import DeepSeek-V3: router bias on a dense block", 1,
        ["import", "--format", "hf", "{dsv3w}/bias_dense", "{dir}/run/imported.h5"], 1,
        ["{dsv3w}/bias_dense/model.safetensors: tensor model.layers.0.mlp.gate.e_score_correction_bias (8,) "
         "is a router's balancing bias, but block 0 of the deck's model", "is dense "
         "(model.moe_first_dense_layers = 1, config.json's first_k_dense_replace)"],
        needs=["dsv3w"], then=nothing_imported),
    # issue 54 (muondist): Muon runs under tp and ZeRO 1-3 now (layout_parity); what it still
    # does not run on is refused by name.
    row("deck", "muon with optimizer offload", 1,
        train("train.optimizer=\"muon\"", "parallel.offload=\"optimizer\""), 1,
        ["parallel.offload = \"optimizer\" with train.optimizer = \"muon\"",
         "use parallel.offload = \"none\", or train.optimizer = \"adamw\""], absent=NOT_TRAINED),
    # issue 53 (mtp): multi-token prediction's keys where they would be ignored or cannot work.
    row("deck", "mtp_loss_weight without mtp_layers", 1,
        train("model.family=\"llama\"", "model.mtp_loss_weight=0.1"), 1,
        ["deck.toml: model.mtp_loss_weight is given but model.mtp_layers = 0",
         "set model.mtp_layers >= 1, or remove it"]),
    row("deck", "mtp_layers as long as the sequence", 1,
        train("model.family=\"llama\"", "model.mtp_layers=16"), 1,
        ["deck.toml: model.mtp_layers = 16 leaves depth 16 no position to predict from in a "
         "sequence of model.seq_len = 16 tokens (mtp_layers must be below seq_len)"]),
    # issue 55 (ctxext): a rotary model resumes at another seq_len and rotary scaling (context
    # extension, tests/train/context_extension_test.cpp); a learned position table still bounds
    # it, with both numbers, and any other change of the model keeps its refusal.
    row("checkpoint", "gpt2 resumed above its position table", 2,
        train("checkpoint.dir=\"{a}\"", "model.seq_len=32", "train.steps=6"), 1,
        ["{a}/step_00000004.h5: model.seq_len = 16 in the checkpoint", "has model.seq_len = 32",
         "learned position table (model.positions = \"learned\", wpe) has 16 rows, so its context "
         "cannot reach 32 tokens", "set model.seq_len = 16"], needs=["run_a"], absent=["step     5/"]),
    row("checkpoint", "rotary resume at another length and another vocabulary", 2,
        train("model.family=\"llama\"", "run.dir=\"{dir}/llama\"", "model.seq_len=32",
              "model.rope_scaling=\"yarn\"", "model.rope_factor=2.0",
              "model.rope_original_max_positions=16", "model.vocab_size=512", "train.steps=4"), 1,
        ["{dir}/llama/checkpoints/step_00000002.h5: model.vocab_size = 256 in the checkpoint",
         "has model.vocab_size = 512: the checkpoint holds another model (set model.vocab_size = 256"],
        needs=["run_llama"], absent=["step     3/", "context extension"]),
    # issue 55 (tpkv): tp beyond the key/value heads shares each head over tp / kv_heads ranks;
    # a tp that neither divides kv_heads nor is a multiple of it is still refused, naming both.
    row("deck", "tp neither divides nor multiplies kv_heads", 3,
        train("model.family=\"llama\"", "model.heads=6", "model.kv_heads=2", "model.d_model=48",
              "parallel.tp=3"), 1,
        ["deck.toml: parallel.tp = 3 neither divides model.kv_heads = 2 nor is a multiple of it",
         "shares one with tp / kv_heads ranks: tp must be one of 1, 2, 6)"], absent=NOT_TRAINED),
    # issue 56 (evaltask): `eval --task` and train.eval_tasks refuse a bad task file naming the
    # file, the line and the field, on every rank alike (io/choice_tasks.h, train/choice_scoring.h).
    row("data", "eval task file missing", 2, eval_task("{dir}/no_such_task.jsonl"), 1,
        ["{dir}/no_such_task.jsonl"], needs=["run_a"]),
] + [
    # Each bad task file (fixture "tasks"): the file, line N and what is wrong with its field.
    row("data", "eval task " + what, 2, eval_task("{tasks}/" + name) + extra, 1,
        ["{tasks}/" + name + ": line " + said], needs=["run_a", "tasks"])
    for what, name, extra, said in (
        ("line not JSON", "not_json.jsonl", [], "2: not JSON (column"),
        ("gold out of range", "gold.jsonl", [],
         '1: field "gold" is 3, not a choice index (expected an integer from 0 to 1)'),
        ("with no choices", "no_choices.jsonl", [],
         '1: field "choices" is empty (expected at least one choice)'),
        ("hellaswag label missing", "hellaswag_label.jsonl", [], '1: no field "label"'),
        ("context tokenizes to nothing", "empty_context.jsonl", [],
         '1: the context "" tokenizes to no tokens'),
        ("choice adds no tokens", "empty_choice.jsonl", [],
         "1: choice 1: tokenizes to no tokens past the context's"),
        ("line over the line bound", "long_line.jsonl", ["--max-line-bytes", "1000"],
         "2: the line is 5045 bytes long, more than --max-line-bytes 1000 bytes"))
] + [
    row("data", "eval task file without examples", 2, eval_task("{tasks}/blank.jsonl"), 1,
        ["{tasks}/blank.jsonl: no examples"], needs=["run_a", "tasks"]),
    row("deck", "train eval_tasks with a bad task file", 2,
        train('train.eval_tasks=["{tasks}/gold.jsonl"]'), 1,
        ["{tasks}/gold.jsonl: line 1: field \"gold\" is 3"], needs=["tasks"], absent=NOT_TRAINED),
    row("deck", "train eval_tasks not an array", 1, train('train.eval_tasks="x.jsonl"'), 1,
        ['train.eval_tasks = "x.jsonl" is a string (expected an array of JSON Lines task file paths)'],
        absent=NOT_TRAINED),
    row("deck", "train eval_tasks under ZeRO-3", 2,
        train('train.eval_tasks=["{tasks}/good.jsonl"]', "parallel.zero=3"), 1,
        ["train.eval_tasks scores with the generator: parallel.zero = 3 shards the parameters"],
        needs=["tasks"], absent=NOT_TRAINED),
    # issue 54 (muonclip): QK-clip's threshold (a negative or non-finite tau), and the models
    # and layouts whose logits it cannot clip or does not record yet, each refused by name.
    row("deck", "qk clip threshold negative", 1, train("train.qk_clip_threshold=-1.0"), 1,
        ["train.qk_clip_threshold = -1.0 is out of range (expected finite number from 0 to 1e+09)"],
        absent=NOT_TRAINED),
    row("deck", "qk clip threshold NaN", 1, train("train.qk_clip_threshold=nan"), 1,
        ["train.qk_clip_threshold = nan is not a finite number"], absent=NOT_TRAINED),
    row("deck", "qk clip with q/k norms", 1,
        train("model.family=\"qwen3\"", "train.qk_clip_threshold=100.0"), 1,
        ["train.qk_clip_threshold = 100 with model.qk_norm = true: the query and key norms undo "
         "any scaling of their projections"], absent=NOT_TRAINED),
    row("deck", "qk clip with context parallelism", 2,
        train("train.qk_clip_threshold=100.0", "parallel.cp=2"), 1,
        ["train.qk_clip_threshold = 100 with parallel.cp = 2: ring attention does not record the "
         "heads' largest logits yet (use cp = 1, or qk_clip_threshold = 0)"], absent=NOT_TRAINED),
    # issue 56 (blend): a weighted blend's bad weights, files and vocabularies are refused naming
    # the source (index, and its path or name); data.on_exhausted = "stop" refuses a run that
    # would draw a sample twice; a checkpoint's blend position must fit the deck's blend.
    *[row("deck", "blend: " + what, 2, train("data.train=[%s]" % tables), 1, [expect])
      for what, tables, expect in (
          ("negative weight", '{{path = "a.bin", weight = 0.5}}, {{path = "b.bin", weight = -1}}',
           'at source 1 (path "b.bin"): weight = -1 is not a finite number >= 0'),
          ("NaN weight", '{{path = "a.bin", weight = nan}}',
           'at source 0 (path "a.bin"): weight = nan is not a finite number >= 0'),
          ("infinite weight", '{{path = "a.bin"}}, {{path = "b.bin", weight = inf}}',
           'at source 1 (path "b.bin"): weight = inf is not a finite number >= 0'),
          ("weights summing to zero", '{{path = "a.bin", weight = 0}}, {{path = "b.bin", weight = 0.0}}',
           "has weights summing to 0.000000: at least one weight must be > 0"),
          ("unknown key in a source", '{{path = "a.bin", wieght = 2}}',
           "at source 0 (path \"a.bin\"): has an unknown key 'wieght' (a source has path, weight, name)"),
          ("synthetic as a source", '{{path = "synthetic"}}',
           "a blend's sources are token shards, not \"synthetic\""),
          ("two sources of one name", '{{path = "a.bin", name = "web"}}, {{path = "b.bin", name = "web"}}',
           'at source 1 (path "b.bin"): name "web" is an earlier source\'s too'))],
    row("data", "blend: a source's glob matches nothing", 2,
        train('data.train=[{{path = "{dir}/text_train.bin"}}, {{path = "{dir}/missing_*.bin", name = "gone"}}]'), 1,
        ['data.train source 1 (name "gone"): {dir}/missing_*.bin: glob pattern matches no files'],
        needs=["shards"], absent=NOT_TRAINED),
    # A header claiming 512 tokens beside one of 256: another tokenizer's ids, or the model's too few.
    *[row("data", "blend: a source's vocabulary " + what, 2,
          train('data.train=[{{path = "{dir}/text_train.bin"}}, {{path = "{dir}/vocab512.bin", name = "wide"}}]',
                "model.vocab_size=%d" % vocab), 1,
          ['data.train source 1 (name "wide"): {dir}/vocab512.bin ' + expect], needs=["blend"], absent=NOT_TRAINED)
      for what, vocab, expect in (
          ("differs from another's", 512, 'has a vocabulary of 512, but data.train source 0 (name '
           '"{dir}/text_train.bin") ({dir}/text_train.bin) has 256'),
          ("exceeds the model's", 256, "holds tokens of a vocabulary of 512, more than model.vocab_size = 256"))],
    row("deck", "blend: on_exhausted stop and a source runs out", 2,
        train('data.train=[{{path = "{dir}/text_train.bin", weight = 3, name = "text"}}, '
              '{{path = "{dir}/short_train.bin"}}]', 'data.on_exhausted="stop"', "train.steps=40"), 1,
        ['data.on_exhausted = "stop": data.train source 0 (name "text") has', "but the blend draws "
         "more in step", 'set data.on_exhausted = "wrap"'], needs=["shards"], absent=NOT_TRAINED),
    row("deck", "on_exhausted stop and one source runs out", 2,
        train('data.train="{dir}/text_train.bin"', 'data.on_exhausted="stop"', "train.steps=40"), 1,
        ['data.on_exhausted = "stop": data.train has', "train.steps = 40 x train.global_batch = 8 "
         "draws 320"], needs=["shards"], absent=NOT_TRAINED),
    row("checkpoint", "blend of two resumes a one-source checkpoint", 2,
        train('checkpoint.resume="{a}/step_00000004.h5"', 'checkpoint.dir="{dir}/run/blend2"',
              "train.steps=6",
              'data.train=[{{path = "{dir}/text_train.bin"}}, {{path = "{dir}/short_train.bin"}}]'), 1,
        ["{a}/step_00000004.h5: records no blend position", "as a blend of 2 sources"],
        needs=["run_a", "shards"], absent=["step     5/"]),
    # issue 56 (tboard): run.tensorboard's folder taken by a file is refused before training,
    # naming it, on every rank (the file left as it was).
    row("run", "tensorboard folder is a file", 2,
        train("run.tensorboard=true", "run.dir=\"{dir}/tbfile\""), 1,
        ["{dir}/tbfile/tensorboard: cannot create the folder of the TensorBoard event files "
         "(run.tensorboard = true): it exists and is not a directory (expected a directory the run "
         "can write; remove or rename what is there, or set run.tensorboard = false)"],
        needs=["tbfile"], absent=NOT_TRAINED),
    # issue 55 (swa): sliding windows (model.attention_window) out of range, a pattern longer
    # than the model, and what they do not run with yet, each refused by name.
    row("deck", "attention_window negative", 1,
        train("model.family=\"llama\"", "model.attention_window=[8, -1]"), 1,
        ["--set model.attention_window=[8, -1]: model.attention_window = [ 8, -1 ] holds a window "
         "outside 0 to 2147483647", "expected 0 to 2147483647, or an array of them"],
        absent=NOT_TRAINED),
    row("deck", "attention_window of strings", 1,
        train("model.family=\"llama\"", "model.attention_window=\"8\""), 1,
        ["model.attention_window = \"8\" is a string (expected 0 to 2147483647"], absent=NOT_TRAINED),
    row("deck", "attention_window pattern longer than the model", 1,
        train("model.family=\"llama\"", "model.attention_window=[8, 0, 8, 0, 8]"), 1,
        ["deck.toml: model.attention_window = [8, 0, 8, 0, 8] has 5 entries, more than "
         "model.layers = 4"], absent=NOT_TRAINED),
    row("deck", "attention_window with latent attention", 1,
        train("model.family=\"deepseek_v3\"", "model.attention_window=8"), 1,
        ["model.attention_window = 8 does not combine with model.attention = \"latent\" yet"],
        absent=NOT_TRAINED),
    row("deck", "attention_window with context parallelism", 2,
        train("model.family=\"llama\"", "model.attention_window=8", "parallel.cp=2"), 1,
        ["model.attention_window = 8 does not combine with parallel.cp = 2 yet",
         "use cp = 1, or attention_window = 0"], absent=NOT_TRAINED),
]


# --- fixtures: built once, on first use; each returns None or why it cannot be had here ---------

def prepare(tmp, text, out, *extra):
    subprocess.run([BIN, "prepare", text, "--out", os.path.join(tmp, out)] + list(extra),
                   check=True, capture_output=True, env=ENV)


def fixture_shards(p):
    """A good shard, a short validation one, and two corrupt copies of the good one (a token
    beyond the vocabulary, a flipped byte)."""
    tmp = p["dir"]
    text = os.path.join(tmp, "text.txt")
    with open(text, "w") as f:
        f.write("the quick brown fox jumps over the lazy dog. " * 40)
    prepare(tmp, text, "text")
    prepare(tmp, text, "short", "--val-fraction", "0.005")
    good = open(os.path.join(tmp, "text_train.bin"), "rb").read()
    bad = bytearray(good)
    bad[64 + 2 * 100:64 + 2 * 101] = (60000).to_bytes(2, "little")  # token 100
    open(os.path.join(tmp, "bad_token.bin"), "wb").write(bad)
    flipped = bytearray(good)
    flipped[64 + 2 * 500] ^= 0x01  # a letter becomes its neighbour: still in the vocabulary
    open(os.path.join(tmp, "flipped.bin"), "wb").write(flipped)


def fixture_broken(p):
    with open(p["broken"], "w") as f:
        f.write("[model]\nlayers = = 4\n")


def train_fixture(p, name, *sets):
    args = [MPIEXEC, "-n", "2", BIN, "train", p["deck"], "--set",
            "run.dir=\"%s\"" % os.path.join(p["dir"], name)]
    for s in sets:
        args += ["--set", s]
    done = subprocess.run(args, capture_output=True, text=True, env=ENV, timeout=300)
    if done.returncode != 0:
        raise RuntimeError("fixture run %s failed:\n%s" % (name, done.stdout + done.stderr))


def fixture_run_a(p):
    train_fixture(p, "a", "train.steps=4")


def fixture_run_b(p):
    train_fixture(p, "b", "run.seed=5")


def fixture_damaged(p):
    """Copies of run A's step 2: truncated, one byte of a parameter flipped, and a text file."""
    fixture_run_a_once(p)
    os.makedirs(p["damaged"])
    good = open(os.path.join(p["a"], "step_00000002.h5"), "rb").read()
    open(os.path.join(p["damaged"], "truncated.h5"), "wb").write(good[:len(good) // 40])
    open(os.path.join(p["damaged"], "text.h5"), "w").write("not a checkpoint\n")
    try:
        import h5py
    except ImportError:
        return None  # the flipped row then fails on its missing file, naming it
    with h5py.File(os.path.join(p["a"], "step_00000002.h5"), "r") as f:
        offset = f["model/h.0.attn.qkv.weight"].id.get_offset()
    flipped = bytearray(good)
    flipped[offset + 5] ^= 0x10
    open(os.path.join(p["damaged"], "flipped.h5"), "wb").write(flipped)
    return None


def mount_tmpfs(path, size, options=""):
    """Mounts a tmpfs of `size` bytes at path; returns an error text or None."""
    os.makedirs(path, exist_ok=True)
    opts = "size=%d" % size + ("," + options if options else "")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", path],
                          capture_output=True, text=True)
    if done.returncode == 0:
        MOUNTS.append(path)
        return None
    return "cannot mount a tmpfs (%s); run as root" % (done.stderr.strip() or "mount failed")


def fixture_read_only(p):
    return mount_tmpfs(p["read_only"], 1 << 20, "ro")


def fixture_full(p):
    """Room for step 2 of this deck and half of step 4."""
    fixture_run_a_once(p)
    size = os.path.getsize(os.path.join(p["a"], "step_00000002.h5"))
    return mount_tmpfs(p["full"], (size * 3 // 2 + 4095) // 4096 * 4096)


def fixture_fifos(p):
    """FIFOs with no writer where every reader looks for a file, and a text file beside them,
    in a directory of their own: the driver's snapshot reads every file of the test directory,
    and would block on them."""
    fifo = tempfile.mkdtemp(prefix="meshtrain_fifo_")
    atexit.register(shutil.rmtree, fifo, True)
    p["fifo"] = fifo
    os.makedirs(os.path.join(fifo, "hf"))
    for name in ("deck.toml", "shard.bin", "tokenizer.json", "input.txt", "step_00000002.h5",
                 "machine.toml", "hf/config.json", "hf/model.safetensors"):
        os.mkfifo(os.path.join(fifo, name))
    with open(os.path.join(fifo, "text.txt"), "w") as f:
        f.write("the quick brown fox jumps over the lazy dog. " * 40)


def fixture_jsonl(p):
    """JSON Lines corpora, each with one kind of bad line after a good one; a good one compressed
    whole, cut short and with a flipped byte, with gzip (Python) and zstd (the command)."""
    d = os.path.join(p["dir"], "jsonl")
    p["jsonl"] = d
    os.makedirs(d)
    good = b"".join(b'{"text": "document %d: the quick brown fox", "id": %d}\n' % (i, i)
                    for i in range(2000))
    first = b'{"text": "a good line"}\n'
    files = {"good.jsonl": good, "invalid.jsonl": first + b'{"text": "no closing brace"\n',
             "array.jsonl": first + b'["text"]\n', "missing.jsonl": first + b'{"content": "x"}\n',
             "number.jsonl": first + b'{"text": 42}\n',
             "latin1.jsonl": first + b'{"text": "caf\xe9"}\n',
             "three_bad.jsonl": first + b"{\n" + first + b"{\n{\n" + first}
    for name, data in files.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
    import gzip
    packed = gzip.compress(good)
    zst = subprocess.run(["zstd", "-q", "-c", os.path.join(d, "good.jsonl")], check=True,
                         capture_output=True).stdout
    for kind, data in (("gz", packed), ("zst", zst)):
        with open(os.path.join(d, "truncated.jsonl." + kind), "wb") as f:
            f.write(data[:len(data) * 2 // 3])
        flipped = bytearray(data)
        flipped[len(data) // 2] ^= 0xFF
        with open(os.path.join(d, "corrupt.jsonl." + kind), "wb") as f:
            f.write(bytes(flipped))


def fixture_jsonl50(p):
    """Issue 50's JSON Lines: a number beyond a double, a 5000-byte line, blank lines alone, and
    a good corpus already prepared to done_*.bin (shards a prepare must not replace)."""
    d = os.path.join(p["dir"], "jsonl50")
    p["jsonl50"] = d
    os.makedirs(d)
    first = b'{"text": "a good line"}\n'
    files = {"overflow.jsonl": first + b'{"text": "x", "score": 1e400}\n',
             "long_line.jsonl": first + b'{"text": "' + b"y" * 5000 + b'"}\n' + first,
             "blank.jsonl": b"\n  \n\t\r\n",
             "good.jsonl": first * 50}
    for name, data in files.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
    prepare(d, os.path.join(d, "good.jsonl"), "done")


FIXTURES = {"fifos": fixture_fifos, "shards": fixture_shards, "broken": fixture_broken, "run_a": fixture_run_a,
            "run_b": fixture_run_b, "damaged": fixture_damaged, "read_only": fixture_read_only,
            "full": fixture_full, "jsonl": fixture_jsonl, "jsonl50": fixture_jsonl50}
MOUNTS = []


# --- trust round two: run directory, hangs and crashes (fixtures) ---

HELD = []  # lock files this process holds for as long as it runs


def hold_lock(path):
    """Locks path as another job's rank 0 would, naming this process as the holder. An
    open-file-description lock, as meshtrain's: a classic POSIX lock (fcntl.lockf) would be
    dropped the moment the driver's snapshot() opens and closes the file."""
    import fcntl
    import struct
    f = open(path, "w")
    f.write("node %s, pid %d, since 2026-01-01T00:00:00Z\n" % (NODE, os.getpid()))
    f.flush()
    # struct flock: l_type, l_whence, l_start, l_len, l_pid (x86-64 and aarch64 layout)
    fcntl.fcntl(f, fcntl.F_OFD_SETLK, struct.pack("hhqqi", fcntl.F_WRLCK, 0, 0, 0, 0))
    HELD.append(f)


def fixture_locked(p):
    """A run directory (with another job's flight record and metrics) and a checkpoint
    directory that this process holds locked."""
    p["pid"] = os.getpid()
    p["locked"] = os.path.join(p["dir"], "locked")
    p["locked_checkpoints"] = os.path.join(p["dir"], "locked_checkpoints")
    os.makedirs(os.path.join(p["locked"], "flight"))
    os.makedirs(p["locked_checkpoints"])
    with open(os.path.join(p["locked"], "flight", "rank_000000.rec"), "wb") as f:
        f.write(b"the other job's flight record" * 100)
    with open(os.path.join(p["locked"], "metrics.jsonl"), "w") as f:
        f.write('{"step": 1}\n')
    with open(os.path.join(p["locked_checkpoints"], "keep"), "w") as f:
        f.write("the other job's\n")
    hold_lock(os.path.join(p["locked"], ".meshtrain.lock"))
    hold_lock(os.path.join(p["locked_checkpoints"], ".meshtrain.lock"))


def fixture_named(p):
    """Checkpoint directories holding a directory named like a checkpoint (step 6) and like a
    .tmp (step 4), each with a file in it."""
    p["named"] = os.path.join(p["dir"], "named")
    p["named_tmp"] = os.path.join(p["dir"], "named_tmp")
    for d in (os.path.join(p["named"], "step_00000006.h5"),
              os.path.join(p["named_tmp"], "step_00000004.h5.tmp")):
        os.makedirs(d)
        with open(os.path.join(d, "keep"), "w") as f:
            f.write("not a checkpoint\n")


FIXTURES.update({"locked": fixture_locked, "named": fixture_named})
BUILT = {}


# --- trust round two: untrusted files (fixture) ---
def fixture_untrusted(p):
    """Hostile copies of run A's step 2 in {dir}/untrusted, each with checksums that match what
    a reader would read, an HF export of it, and a file an import must not write over."""
    fixture_run_a_once(p)
    try:
        import h5py
        import numpy as np
    except ImportError:
        return "h5py is not installed (Debian: python3-h5py)"
    d = os.path.join(p["dir"], "untrusted")
    os.makedirs(d)
    good = os.path.join(p["a"], "step_00000002.h5")
    target = "/model/h.0.ln_1.weight"
    k = np.uint64(0x9E3779B97F4A7C15)

    def checksum(values):
        flat = np.ascontiguousarray(values, dtype=np.float32).ravel()
        with np.errstate(over="ignore"):
            x = np.arange(flat.size, dtype=np.uint64) * k + flat.view(np.uint32).astype(np.uint64)
            x = x + k
            x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            return np.uint64((x ^ (x >> np.uint64(31))).sum(dtype=np.uint64))

    def craft(name, edit):
        path = os.path.join(d, name)
        shutil.copy(good, path)
        with h5py.File(path, "r+") as f:
            edit(f)

    def replace(f, make, values):
        del f[target]
        make(f)
        f[target].attrs.create("checksum", checksum(values), dtype=np.uint64)

    with h5py.File(good, "r") as f:
        values = f[target][...]
    outside = os.path.join(d, "outside.bin")
    np.arange(values.size, dtype=np.float32).tofile(outside)
    craft("external.h5", lambda f: replace(f, lambda g: g.create_dataset(
        target, shape=values.shape, dtype=np.float32, external=[(outside, 0, values.size * 4)]),
        np.fromfile(outside, dtype=np.float32)))

    def link(f, to):
        del f[target]
        f[target] = to
    craft("external_link.h5", lambda f: link(f, h5py.ExternalLink(good, target)))
    craft("soft_link.h5", lambda f: link(f, h5py.SoftLink("/model/h.0.ln_1.bias")))

    def virtual(g):
        layout = h5py.VirtualLayout(shape=values.shape, dtype=np.float32)
        layout[...] = h5py.VirtualSource(good, target, shape=values.shape)
        g.create_virtual_dataset(target, layout)
    craft("virtual.h5", lambda f: replace(f, virtual, values))
    craft("gzip.h5", lambda f: replace(f, lambda g: g.create_dataset(target, data=values, compression="gzip"),
                                       values))

    def huge(f):
        f.create_dataset("/model/huge", shape=(1 << 28,), dtype=np.float32)
    craft("declares.h5", huge)

    def attribute(key, value):
        def edit(f):
            del f.attrs[key]
            f.attrs.create(key, value, dtype=value.dtype)
        return edit
    craft("step.h5", attribute("step", np.int64(2**32 + 2)))
    craft("world_size.h5", attribute("world_size", np.int64(2**32 + 1)))

    def moment(f):
        name = "/optim/h.0.ln_1.weight/exp_avg_sq"
        v = f[name][...]
        v.ravel()[3] = -1.0
        f[name][...] = v
        f[name].attrs.modify("checksum", checksum(v))
    craft("moment.h5", moment)
    shutil.copy(good, os.path.join(d, "existing.h5"))
    hf = os.path.join(d, "hf")
    subprocess.run([BIN, "export", good, "--format", "hf", hf], check=True, capture_output=True, env=ENV)
    shutil.copytree(hf, os.path.join(d, "hf_config_dir"))
    os.remove(os.path.join(d, "hf_config_dir", "config.json"))
    os.makedirs(os.path.join(d, "hf_config_dir", "config.json"))
    return None


FIXTURES["untrusted"] = fixture_untrusted


# --- issue 53 (dsv3fam): FP8 block-scaled HF directories, one fault each (fixture) ---
def read_safetensors_raw(path):
    """({name: (dtype, shape, bytes)} in file order) of a safetensors file."""
    with open(path, "rb") as f:
        blob = f.read()
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + n])
    header.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], blob[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])}


def write_safetensors_raw(path, tensors):
    header, at = {}, 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + len(data)]}
        at += len(data)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text + b"".join(t[2] for t in tensors.values()))


def fixture_fp8(p):
    """{dir}/fp8/<variant>: run A's HF export (GPT-2, under the deck) with its first MLP input weight
    (32, 128) stored as F8_E4M3 codes and F32 scales of blocks [16, 48] (a (2, 3) grid, the last
    column block partial), config.json declaring it, and one fault in each variant."""
    fixture_run_a_once(p)
    d = p["fp8"] = os.path.join(p["dir"], "fp8")
    src = os.path.join(d, "base")
    subprocess.run([BIN, "export", os.path.join(p["a"], "step_00000002.h5"), "--format", "hf", src], check=True,
                   capture_output=True, env=ENV)
    base = read_safetensors_raw(os.path.join(src, "model.safetensors"))
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    w = "transformer.h.0.mlp.c_fc.weight"
    assert base[w][1] == [32, 128], base[w][1]
    codes = bytes((k * 37 + 11) % 0x7F | (0x80 if k % 3 == 0 else 0) for k in range(32 * 128))
    one = bytes.fromhex("0000803f")  # float32 1.0, little-endian

    def variant(name, quantization=None, tensors=None):
        os.makedirs(os.path.join(d, name))
        c = dict(config)
        if quantization is not None:
            c["quantization_config"] = quantization
        with open(os.path.join(d, name, "config.json"), "w") as f:
            json.dump(c, f)
        write_safetensors_raw(os.path.join(d, name, "model.safetensors"), tensors or quantized())

    def quantized(grid=(2, 3), scale=True, weight_codes=codes, dtype="F8_E4M3"):
        t = dict(base)
        t[w] = (dtype, [32, 128], weight_codes)
        if scale:
            t[w + "_scale_inv"] = ("F32", list(grid), one * (grid[0] * grid[1]))
        return t

    fp8 = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [16, 48]}
    variant("gptq", {"quant_method": "gptq", "bits": 4})
    variant("compressed", {"quant_method": "compressed-tensors"})
    variant("e5m2", dict(fp8, fmt="e5m2"))
    variant("block", dict(fp8, weight_block_size=[128]))
    variant("no_scale", fp8, quantized(scale=False))
    variant("floor", fp8, quantized(grid=(2, 2)))
    orphan = quantized()
    orphan["transformer.h.0.mlp.c_proj.weight_scale_inv"] = ("F32", [1, 1], one)
    variant("orphan", fp8, orphan)
    stray = quantized()
    stray["transformer.h.9.mlp.c_fc.weight_scale_inv"] = ("F32", [1, 1], one)
    variant("stray", fp8, stray)
    variant("nan", fp8, quantized(weight_codes=codes[:5] + b"\x7f" + codes[6:]))
    variant("unscaled", None, quantized())
    variant("f8_e5m2", fp8, quantized(dtype="F8_E5M2"))
    return None


FIXTURES["fp8"] = fixture_fp8


# --- issue 50 (i50-tokenizer): tokenizer.json files with one bad field each (fixture) ---
def fixture_tokjson(p):
    """{dir}/tokjson: a text, and byte-level BPE tokenizer.json files (the 256 bytes and
    "hello"), each with one field meshtrain must refuse."""
    d = os.path.join(p["dir"], "tokjson")
    p["tokjson"] = d
    os.makedirs(d)
    with open(os.path.join(d, "text.txt"), "w") as f:
        f.write("hello world, hello again.\n" * 40)
    # GPT-2's bytes_to_unicode, as the BPE reference test writes it.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "io"))
    from gpt2_bpe_reference_test import B2U
    vocab = {B2U[b]: b for b in range(256)}
    vocab["hello"] = 256

    def base():
        return {"version": "1.0", "added_tokens": [], "normalizer": None,
                "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False,
                                  "trim_offsets": True, "use_regex": True},
                "post_processor": None,
                "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                            "use_regex": True},
                "model": {"type": "BPE", "vocab": dict(vocab), "merges": []}}
    variants = {}
    for name, id_ in (("huge_id", 200000000), ("id_2_31", 2 ** 31 + 5)):
        variants[name] = base()
        variants[name]["model"]["vocab"]["hello"] = id_
    variants["ignore_merges_yes"] = base()
    variants["ignore_merges_yes"]["model"]["ignore_merges"] = "yes"
    variants["dropout"] = base()
    variants["dropout"]["model"]["dropout"] = 0.1
    variants["roberta"] = base()
    variants["roberta"]["post_processor"] = {"type": "RobertaProcessing", "sep": ["</s>", 2],
                                             "cls": ["<s>", 0], "trim_offsets": True,
                                             "add_prefix_space": False}
    variants["bert_normalizer"] = base()
    variants["bert_normalizer"]["normalizer"] = {"type": "BertNormalizer", "clean_text": True,
                                                 "handle_chinese_chars": True,
                                                 "strip_accents": None, "lowercase": True}
    eot = {"content": "<|endoftext|>", "single_word": False, "lstrip": False, "rstrip": False,
           "normalized": False, "special": True}
    variants["added_2_40"] = base()
    variants["added_2_40"]["added_tokens"] = [dict(eot, id=2 ** 40)]
    variants["added_twice"] = base()
    variants["added_twice"]["added_tokens"] = [dict(eot, id=256 + 0), dict(eot, id=257)]
    variants["added_twice"]["model"]["vocab"].pop("hello")
    for name, tok in variants.items():
        with open(os.path.join(d, name + ".json"), "w") as f:
            json.dump(tok, f)


FIXTURES["tokjson"] = fixture_tokjson


def fixture_loader(p):
    """The smallest address-space limit (kB, within 5 MB) under which the dynamic loader maps this
    binary and its libraries (below it, exit 127 before any meshtrain code runs)."""
    def loads(kb):
        r = subprocess.run(["sh", "-c", "ulimit -v %d; exec \"$0\" --help" % kb, BIN],
                           capture_output=True, env=ENV)
        return r.returncode != 127
    lo, hi = 20000, 8000000
    if not loads(hi):
        return "the binary does not load under an 8 GB address-space limit"
    while hi - lo > 5000:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if loads(mid) else (mid, hi)
    p["loader_kb"] = hi


FIXTURES["loader"] = fixture_loader


def need(p, name):
    if name not in BUILT:
        BUILT[name] = FIXTURES[name](p)
    return BUILT[name]


def fixture_run_a_once(p):
    need(p, "run_a")


def fixture_run_muon(p):
    """issue 54 (muon): a Muon run's step-2 checkpoint in {dir}/muon/checkpoints."""
    train_fixture(p, "muon", "train.optimizer=\"muon\"")


FIXTURES.update({"run_muon": fixture_run_muon})


def fixture_run_llama(p):
    """issue 55 (ctxext): a rotary (Llama) run's step-2 checkpoint in {dir}/llama/checkpoints."""
    train_fixture(p, "llama", "model.family=\"llama\"")


FIXTURES.update({"run_llama": fixture_run_llama})


def fixture_dsv3(p):
    """issue 53 (dsv3fam2): {dir}/dsv3/<variant>/config.json, a tiny DeepseekV3ForCausalLM's with
    one key meshtrain refuses (no weights: the config is refused first)."""
    d = p["dsv3"] = os.path.join(p["dir"], "dsv3")
    config = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": 256,
              "hidden_size": 32, "intermediate_size": 48, "moe_intermediate_size": 8, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 4, "n_routed_experts": 8, "kv_lora_rank": 16,
              "q_lora_rank": None, "qk_rope_head_dim": 4, "v_head_dim": 6, "qk_nope_head_dim": 8,
              "n_group": 4, "topk_group": 2, "num_experts_per_tok": 2, "first_k_dense_replace": 1}
    for name, change in (("softmax", {"scoring_func": "softmax"}), ("kv_heads", {"num_key_value_heads": 2})):
        os.makedirs(os.path.join(d, name))
        with open(os.path.join(d, name, "config.json"), "w") as f:
            json.dump(dict(config, **change), f)
        open(os.path.join(d, name, "model.safetensors"), "wb").close()


FIXTURES["dsv3"] = fixture_dsv3


def fixture_dsv3_weights(p):
    """issue 53 (dsv3hf): {dir}/dsv3w/<variant>, a tiny DeepseekV3ForCausalLM directory with
    weights (tests/support/tiny_hf_moe.py; a dense block 0, mixture blocks 1 and 2 of 8 experts)
    and one fault in its routers' e_score_correction_bias each."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
    try:
        import tiny_hf_moe
    except ImportError as e:
        return f"{e.name} is not installed (Debian: python3-numpy python3-h5py)"
    d = p["dsv3w"] = os.path.join(p["dir"], "dsv3w")
    tiny_hf_moe.write("deepseek_v3", os.path.join(d, "base"))
    base = read_safetensors_raw(os.path.join(d, "base", "model.safetensors"))
    bias = "model.layers.{}.mlp.gate.e_score_correction_bias"
    f32 = base[bias.format(1)][2]
    variants = {
        "bias_shape": {bias.format(1): ("F32", [7], f32[:28])},
        "bias_fp8": {bias.format(2): ("F8_E4M3", [8], bytes(range(8)))},
        "bias_dense": {bias.format(0): ("F32", [8], f32)},
    }
    for name, change in variants.items():
        os.makedirs(os.path.join(d, name))
        shutil.copy(os.path.join(d, "base", "config.json"), os.path.join(d, name, "config.json"))
        write_safetensors_raw(os.path.join(d, name, "model.safetensors"), dict(base, **change))
    return None


FIXTURES["dsv3w"] = fixture_dsv3_weights


def fixture_tasks(p):
    """Issue 56's multiple-choice task files, a good one and one per kind of bad line."""
    d = os.path.join(p["dir"], "tasks")
    p["tasks"] = d
    os.makedirs(d)
    good = b'{"context": "The cat", "choices": [" sat", " ran"], "gold": 0}\n'
    files = {"good.jsonl": good, "not_json.jsonl": good + b'{"context": "x", \n',
             "gold.jsonl": b'{"context": "The cat", "choices": [" sat", " ran"], "gold": 3}\n',
             "no_choices.jsonl": b'{"context": "The cat", "choices": [], "gold": 0}\n',
             "hellaswag_label.jsonl": b'{"activity_label": "A", "ctx_a": "b", "ctx_b": "c", "endings": [" d"]}\n',
             "empty_context.jsonl": b'{"context": "", "choices": [" sat"], "gold": 0}\n',
             "empty_choice.jsonl": b'{"context": "The cat", "choices": [" sat", ""], "gold": 0}\n',
             "long_line.jsonl": good + b'{"context": "' + b"y" * 5000 + b'", "choices": [" a"], "gold": 0}\n',
             "blank.jsonl": b"\n \n"}
    for name, data in files.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)


FIXTURES["tasks"] = fixture_tasks


def fixture_blend(p):
    """The good shard again with a header that claims a vocabulary of 512 (the tokens and their
    checksum unchanged): a source made with another tokenizer."""
    need(p, "shards")
    shard = bytearray(open(os.path.join(p["dir"], "text_train.bin"), "rb").read())
    shard[24:28] = (512).to_bytes(4, "little")
    open(os.path.join(p["dir"], "vocab512.bin"), "wb").write(shard)


FIXTURES["blend"] = fixture_blend


def fixture_tbfile(p):
    """issue 56 (tboard): {dir}/tbfile, a run directory whose tensorboard is a file."""
    os.makedirs(os.path.join(p["dir"], "tbfile"))
    with open(os.path.join(p["dir"], "tbfile", "tensorboard"), "w") as f:
        f.write("not a folder\n")


FIXTURES["tbfile"] = fixture_tbfile


# --- the driver -----------------------------------------------------------------------------

def snapshot(p):
    """{path: sha256} of every file in the test directory outside the scratch run directory."""
    files = {}
    for root, dirs, names in os.walk(p["dir"]):
        dirs[:] = [d for d in dirs if os.path.join(root, d) not in (p["scratch"], p["status"])]
        for n in names:
            path = os.path.join(root, n)
            with open(path, "rb") as f:
                files[path] = hashlib.sha256(f.read()).hexdigest()
    return files


def rank_processes(launcher):
    """The pids of the binary below the launcher (the ranks, under their status wrappers)."""
    found, todo = [], [launcher]
    while todo:
        pid = todo.pop()
        try:
            with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
                children = [int(c) for c in f.read().split()]
        except OSError:
            continue
        for c in children:
            try:
                if os.path.realpath("/proc/%d/exe" % c) == os.path.realpath(BIN):
                    found.append(c)
            except OSError:
                pass
        todo += children
    return found


def run(case, p):
    """Runs one row; returns (per-rank statuses, output, seconds after the start or signal,
    the job's status)."""
    shutil.rmtree(p["status"], ignore_errors=True)
    os.makedirs(p["status"])
    # Each rank records its own status and reports success to mpiexec, which would otherwise kill
    # the remaining ranks as soon as the first one exits non-zero, before they report.
    wrapper = ('"$0" "$@"; echo $? > "{d}/rank.${{OMPI_COMM_WORLD_RANK:-${{PMI_RANK:-0}}}}"'
               ).format(d=p["status"])
    memory_kb = case.get("memory_kb") or (
        p["loader_kb"] + case["memory_above_loader_kb"] if "memory_above_loader_kb" in case else None)
    if memory_kb:
        wrapper = "ulimit -v %d; %s" % (memory_kb, wrapper)
    if case.get("prelude"):
        wrapper = case["prelude"] + wrapper
    fill = lambda args: [a.format(**p) for a in args]
    if case.get("mpmd"):
        cmd = [MPIEXEC]
        for i, part in enumerate(case["mpmd"]):
            cmd += ([":"] if i else []) + ["-n", "1", "sh", "-c", wrapper, BIN] + fill(part)
    else:
        cmd = [MPIEXEC, "-n", str(case["ranks"]), "sh", "-c", wrapper, BIN] + fill(case["args"])
    env = dict(ENV, **{k: v.format(**p) for k, v in case.get("env", {}).items()})
    stop_file = os.path.join(p["scratch"], "STOP")
    if case.get("stop_file"):
        os.makedirs(p["scratch"], exist_ok=True)
        env["MESHTRAIN_STOP_FILE"] = stop_file
        if case["stop_file"] == "before":
            open(stop_file, "w").close()
    start = time.time()
    launcher = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
    if case.get("stop_file") == "training":
        first = os.path.join(p["scratch"], "checkpoints", "step_00000002.h5")
        while not os.path.exists(first) and launcher.poll() is None and time.time() < start + 120:
            time.sleep(0.1)
        open(stop_file, "w").close()
        start = time.time()
    signalled = []
    if case.get("signal"):
        sig, after = case["signal"]
        time.sleep(after)
        signalled = rank_processes(launcher.pid)
        start = time.time()
        for pid in signalled:
            os.kill(pid, sig)
    try:
        output, _ = launcher.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        launcher.kill()
        output, _ = launcher.communicate()
        output += "\n[the job did not end within 180 s and was killed]"
    seconds = time.time() - start
    if case.get("signal") and len(signalled) != case["ranks"]:
        output += "\n[signalled %d rank process(es), expected %d]" % (len(signalled), case["ranks"])
    statuses = {}
    for name in os.listdir(p["status"]):
        with open(os.path.join(p["status"], name)) as f:
            statuses[int(name.split(".")[1])] = int(f.read())
    return statuses, output, seconds, launcher.returncode


def check(case, p):
    """Runs one row and prints its line; returns "ok", "FAILED" or "skipped"."""
    for name in case.get("needs", []):
        why = need(p, name)
        if why:
            print("%-10s %-40s skipped: %s" % (case["kind"], case["name"], why))
            return "skipped"
    shutil.rmtree(p["scratch"], ignore_errors=True)
    before = snapshot(p)
    statuses, output, seconds, job = run(case, p)
    after = snapshot(p)
    problems = []
    ranks = case["ranks"]
    if case["status"] == "non-zero":  # ranks the launcher killed record nothing
        if not statuses or any(s == 0 for s in statuses.values()):
            problems.append("exit statuses %s, expected some, all non-zero" % statuses)
    elif case.get("job") is not None:
        if job != case["job"]:
            problems.append("job exit status %d, expected %d" % (job, case["job"]))
    elif sorted(statuses) != list(range(ranks)) or any(s != case["status"] for s in statuses.values()):
        problems.append("exit statuses %s, expected %d on each of %d ranks" % (
            statuses, case["status"], ranks))
    errors = case.get("errors", 1)
    # Agreed errors say "meshtrain: error:", a rank's own "meshtrain: rank N: error:".
    printed = len(re.findall(r"meshtrain(?: \w+)?: (?:rank \d+: )?error:", output))
    if errors is not None and printed != errors:
        problems.append("error printed %d times, expected %d" % (printed, errors))
    if "internal error" in output:
        problems.append("reported as an internal error")
    for text in case["expect"]:
        if text.format(**p) not in output:
            problems.append("missing text: " + text.format(**p))
    for text in case.get("absent", []):
        if text in output:
            problems.append("printed what it must not: " + text)
    if case.get("within") and seconds > case["within"]:
        problems.append("took %.0f s, at most %d s allowed" % (seconds, case["within"]))
    lost = sorted(f for f in before if f not in after)
    changed = sorted(f for f in before if f in after and before[f] != after[f])
    added = sorted(f for f in after if f not in before)
    for what, paths in (("lost", lost), ("changed", changed), ("wrote", added)):
        if paths:
            problems.append("%s %s" % (what, ", ".join(paths)))
    if case.get("then"):
        problems += case["then"](p)
    verdict = "FAILED" if problems else "ok"
    print("%-10s %-40s ranks %d  %5.1fs  %s" % (case["kind"], case["name"], ranks, seconds, verdict))
    if problems:
        print("    " + "\n    ".join(problems))
        print("    output:\n      " + output.strip().replace("\n", "\n      "))
    return verdict


def main():
    tally = {"ok": 0, "FAILED": 0, "skipped": 0}
    tmp = tempfile.mkdtemp(prefix="meshtrain_catalogue_")
    p = {"dir": tmp, "deck": os.path.join(tmp, "deck.toml"), "broken": os.path.join(tmp, "broken.toml"),
         "scratch": os.path.join(tmp, "run"), "status": os.path.join(tmp, "status"),
         "a": os.path.join(tmp, "a", "checkpoints"), "b": os.path.join(tmp, "b", "checkpoints"),
         "damaged": os.path.join(tmp, "damaged"), "node": NODE,
         "read_only": tempfile.mkdtemp(prefix="meshtrain_ro_"),
         "full": tempfile.mkdtemp(prefix="meshtrain_full_")}
    with open(p["deck"], "w") as f:
        f.write(DECK.format(dir=tmp))
    try:
        for case in CATALOGUE:
            if ONLY and not ONLY.search(case["kind"] + " " + case["name"]):
                continue
            tally[check(case, p)] += 1
    finally:
        for m in MOUNTS:
            subprocess.run(["umount", m], capture_output=True)
        for d in (p["read_only"], p["full"]):
            shutil.rmtree(d, ignore_errors=True)
        if not tally["FAILED"]:
            shutil.rmtree(tmp, ignore_errors=True)
    print("%d ok, %d failed, %d skipped%s" % (tally["ok"], tally["FAILED"], tally["skipped"],
                                              "; files kept in " + tmp if tally["FAILED"] else ""))
    return 1 if tally["FAILED"] else 0


if __name__ == "__main__":
    sys.exit(main())
