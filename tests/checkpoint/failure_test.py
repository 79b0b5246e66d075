"""Failures around checkpoints end with one clear message and the right exit status.

- Disk full while writing step 4 (checkpoint.dir on a small tmpfs; skipped, visibly, where
  mounting is not permitted), on 1 and 2 ranks: exit 1 with one error naming the file and the
  free space, no crash in MPI_Finalize, no deadlock in H5Fclose; step 2 is kept and still
  verifies, no .tmp is left.
- checkpoint.dir that cannot be written is refused at start-up, before training, naming the key
  and the path.
- `inspect` on a directory: one line of error, exit 1.
- Resuming a checkpoint at train.steps says so and exits 0; past train.steps is refused
  (exit 1), naming the checkpoint's step and train.steps.
"""

import os
import shutil
import subprocess
import tempfile

import harness


def mount_tmpfs(path, size, options=""):
    """Mounts a tmpfs of `size` bytes at path; returns an error text or None."""
    os.makedirs(path, exist_ok=True)
    opts = "size=%d" % size + ("," + options if options else "")
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", path],
                       capture_output=True, text=True)
    return None if p.returncode == 0 else (p.stderr.strip() or "mount failed")


def umount(path):
    subprocess.run(["umount", path], capture_output=True)


class DiskFull(harness.Case):
    def test_disk_full_keeps_the_previous_checkpoint_and_exits_1(self):
        # The size of one checkpoint of this deck, measured.
        probe = self.run_dir + "_probe"
        self.train(1, ["train.steps=2", "run.dir=\"%s\"" % probe])
        size = os.path.getsize(os.path.join(probe, "checkpoints", "step_00000002.h5"))
        # Room for step 2 and half of step 4.
        mnt = tempfile.mkdtemp(prefix="meshtrain_full_")
        problem = mount_tmpfs(mnt, (size * 3 // 2 + 4095) // 4096 * 4096)
        if problem:
            os.rmdir(mnt)
            self.skipTest("cannot mount a small tmpfs to fill (%s); run as root" % problem)
        try:
            # One rank used to crash in MPI_Finalize (exit 139), two to deadlock in H5Fclose.
            for ranks in (1, 2):
                ckpts = os.path.join(mnt, "checkpoints")
                status, out, err = self.train(ranks, ["checkpoint.dir=\"%s\"" % ckpts], expect=None)
                self.assertEqual(status, 1, "%d rank(s): exit status %d (139: the crash in "
                                 "MPI_Finalize)\n%s\n%s" % (ranks, status, out[-2000:], err[-4000:]))
                self.assertIn("step_00000004.h5.tmp", err)
                self.assertIn("MB free", err)
                self.assertNotIn("Segmentation", err)
                self.assertNotIn("signal", err.lower())
                self.assertEqual(err.count("error:"), 1, err)
                self.assertEqual(sorted(os.listdir(ckpts)), ["step_00000002.h5"])
                _, out, _ = self.inspect(os.path.join(ckpts, "step_00000002.h5"))
                self.assertIn("all checksums OK", out)
                shutil.rmtree(ckpts)
        finally:
            umount(mnt)
            shutil.rmtree(mnt, ignore_errors=True)


class StartUp(harness.Case):
    def test_unwritable_checkpoint_dir_is_refused_before_training(self):
        bad = os.path.join(self.deck, "checkpoints")  # below a regular file
        _, out, err = self.train(2, ["checkpoint.dir=\"%s\"" % bad], expect=1)
        self.assertNotIn("step     1/", out)
        self.assertIn("checkpoint.dir = \"%s\"" % bad, err)
        self.assertEqual(err.count("error:"), 1, err)

        mnt = tempfile.mkdtemp(prefix="meshtrain_ro_")
        problem = mount_tmpfs(mnt, 1 << 20, "ro")
        if problem:
            os.rmdir(mnt)
            self.skipTest("cannot mount a read-only tmpfs (%s); run as root" % problem)
        try:
            _, out, err = self.train(2, ["checkpoint.dir=\"%s\"" % mnt], expect=1)
            self.assertNotIn("step     1/", out)
            self.assertIn("checkpoint.dir = \"%s\"" % mnt, err)
            self.assertIn("Read-only file system", err)
        finally:
            umount(mnt)
            shutil.rmtree(mnt, ignore_errors=True)

    def test_inspect_a_directory(self):
        self.train(1, ["train.steps=2"])
        _, out, err = self.inspect(self.ckpt_dir, expect=1)
        self.assertIn(self.ckpt_dir, err)
        self.assertIn("is a directory", err)
        self.assertLessEqual(len(err.strip().splitlines()), 1, err)

    def test_resume_at_or_past_train_steps(self):
        self.train(2)  # steps 2 and 4 of train.steps = 4
        _, out, _ = self.train(2)
        self.assertIn("resumed from %s at step 4" % self.ckpt(4), out)
        self.assertIn("nothing to train", out)
        self.assertIn("train.steps = 4", out)
        _, out, err = self.train(2, ["train.steps=3"], expect=1)
        self.assertIn(self.ckpt(4), err)
        self.assertIn("step 4", err)
        self.assertIn("train.steps = 3", err)


if __name__ == "__main__":
    harness.main()
