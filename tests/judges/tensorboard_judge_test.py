#!/usr/bin/env python3
"""TensorBoard's own reader as the judge of run.tensorboard (io/tensorboard_writer.h).

A tiny mixture of experts with a multi-token prediction depth trains 4 steps on 2 ranks with run.tensorboard = true (a progress line
every step, validation every 2), then resumes from its step-4 checkpoint to step 6. Then:
- the run folder's tensorboard/ holds two event files (the resumed run appended its own; the first
  is byte for byte what it was), each starting with the file_version event "brain.Event:2";
- tensorboard's EventAccumulator loads the folder, and every scalar it shows equals the value of
  metrics.jsonl's key for the same step (float32 rounding), and every such value is shown: the
  tags are the documented ones (docs/running.md);
- a file cut in the middle of its last record, or of the record's length, as a killed run leaves
  it, still loads, with every whole record before the cut (tensorboard's event file loader and
  EventAccumulator).

Runs in the judges' environment (scripts/judges.py run): CTest label `judge`.
"""
import json
import os
import shutil
import struct
import sys

import numpy as np
from tensorboard.backend.event_processing import event_accumulator, event_file_loader

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "checkpoint"))
import harness  # noqa: E402

# metrics.jsonl key -> TensorBoard tag (docs/running.md); a per-layer list: tag/layer_<L> with L
# from the record's moe_layers.
TAGS = {"loss": "train/loss", "val_loss": "val/loss", "lr": "train/lr", "grad_norm": "train/grad_norm",
        "tokens_per_s": "perf/tokens_per_s", "mtp_loss": "train/mtp_loss",
        "expert_balance": "moe/expert_balance"}

MOE = ['model.family="llama"', 'model.feed_forward="moe"', "model.mtp_layers=1", "run.tensorboard=true",
       "train.eval_every=2"]


def expected_scalars(metrics_path):
    """{tag: {step: value}} of the metrics.jsonl keys TensorBoard mirrors."""
    out = {}
    with open(metrics_path) as f:
        for line in f:
            record = json.loads(line)
            for key, tag in TAGS.items():
                if key not in record:
                    continue
                value = record[key]
                if isinstance(value, list):
                    for layer, v in zip(record["moe_layers"], value):
                        out.setdefault("%s/layer_%d" % (tag, layer), {})[record["step"]] = v
                else:
                    out.setdefault(tag, {})[record["step"]] = value
    return out


def loaded_scalars(path):
    acc = event_accumulator.EventAccumulator(path, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def events(path):
    return list(event_file_loader.EventFileLoader(path).Load())


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def record_starts(data):
    """Offsets of the TFRecords of an event file (uint64 length, 4-byte CRC, payload, 4-byte CRC)."""
    starts, at = [], 0
    while at < len(data):
        starts.append(at)
        at += 8 + 4 + struct.unpack("<Q", data[at:at + 8])[0] + 4
    assert at == len(data), "the file does not end at a record's end"
    return starts


class TensorBoardJudge(harness.Case):

    def assert_same_value(self, tag, step, shown, logged):
        if logged is None:  # metrics.jsonl writes NaN and infinities as null
            self.assertFalse(np.isfinite(shown), "%s at step %d" % (tag, step))
            return
        want = np.float32(logged)
        # metrics.jsonl prints 9 significant digits: its float32 may sit one float32 step away.
        self.assertLessEqual(abs(np.float32(shown) - want), np.spacing(abs(want)),
                             "%s at step %d: TensorBoard %r, metrics.jsonl %r" % (tag, step, shown, logged))

    def test_scalars_resume_and_killed_file(self):
        folder = os.path.join(self.run_dir, "tensorboard")
        self.train(2, MOE)
        first = sorted(os.listdir(folder))
        self.assertEqual(len(first), 1, first)
        first_path = os.path.join(folder, first[0])
        first_bytes = read_bytes(first_path)
        self.train(2, MOE + ["train.steps=6"])
        files = sorted(os.listdir(folder))
        self.assertEqual(len(files), 2, files)
        self.assertEqual(files[0], first[0], "the resumed run's file sorts after the first run's")
        self.assertEqual(read_bytes(first_path), first_bytes, "the first run's file was rewritten")
        for name in files:
            self.assertTrue(name.startswith("events.out.tfevents."), name)
            self.assertEqual(events(os.path.join(folder, name))[0].file_version, "brain.Event:2")

        want = expected_scalars(os.path.join(self.run_dir, "metrics.jsonl"))
        shown = loaded_scalars(folder)
        for tag in ("train/loss", "val/loss", "train/lr", "train/grad_norm", "perf/tokens_per_s",
                    "train/mtp_loss", "moe/expert_balance/layer_1", "moe/expert_balance/layer_4"):
            self.assertIn(tag, shown)
        self.assertEqual(sorted(shown), sorted(want))
        for tag in want:
            self.assertEqual(sorted(shown[tag]), sorted(want[tag]), tag)
            for step, value in want[tag].items():
                self.assert_same_value(tag, step, shown[tag][step], value)
        self.assertEqual(sorted(shown["train/loss"]), [1, 2, 3, 4, 5, 6])
        self.assertEqual(sorted(shown["val/loss"]), [2, 4, 6])

        # A killed run: the first file cut inside its last record's payload, then inside its length.
        data = first_bytes
        last = record_starts(data)[-1]
        whole = events(first_path)[:-1]
        self.assertGreater(len(whole), 2)
        for cut in (last + 12 + (len(data) - last - 16) // 2, last + 3):
            killed = os.path.join(self.dir, "killed_%d" % cut)
            os.makedirs(killed)
            with open(os.path.join(killed, first[0]), "wb") as f:
                f.write(data[:cut])
            self.assertEqual(events(os.path.join(killed, first[0])), whole, "cut at byte %d" % cut)
            loaded = loaded_scalars(killed)
            last_step = whole[-1].step
            self.assertEqual(sorted(loaded["train/loss"]), list(range(1, last_step + 1)), "cut at byte %d" % cut)
            shutil.rmtree(killed)


if __name__ == "__main__":
    harness.main()
