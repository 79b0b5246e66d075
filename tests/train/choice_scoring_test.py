#!/usr/bin/env python3
"""`meshtrain eval --task` (train/choice_scoring.h) against an independent fp64 NumPy reference of
lm-evaluation-harness's multiple-choice scoring, end to end through the binary.

A tiny Llama deck (byte tokenizer) trained two steps in fp64, its weights then replaced by random
ones in Hugging Face's layout (a trained tiny model's logits are nearly flat). Two task files
generated here: the harness's request form (a context longer than seq_len, cut from the left; a
context ending in spaces; choices of different lengths, so that acc and acc_norm can differ) and
HellaSwag's published form (brackets, " [title]", a lower-case ctx_b to capitalise). The reference
(hf_decoder_reference.py's logits; the harness's _encode_pair, left cut, log-softmax sums, argmax
of sums and of sums / byte length, and HellaSwag's preprocessing, all written here in Python)
must match every per-choice log-likelihood within 1e-9, and acc and acc_norm exactly; tp 2,
pp 2 and dp 2 give the same sums (1e-9) and scores. train.eval_tasks logs the same scores to
metrics.jsonl and the progress line as eval gives for the step's checkpoint.

Exit status 77 (CTest: skipped) where NumPy or h5py is missing.
"""

import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import numpy as np
    import h5py  # noqa: F401 (hf_reference_test reads checkpoints with it)
except ImportError as e:
    if __name__ == "__main__":
        print(f"SKIPPED: {e.name} is not installed (Debian: python3-numpy python3-h5py)")
        sys.exit(77)
    raise

sys.path.insert(0, os.path.join(HERE, "..", "reference"))
sys.path.insert(0, os.path.join(HERE, "..", "checkpoint"))
import harness  # noqa: E402
import hf_decoder_reference as ref  # noqa: E402
import hf_reference_test as hf  # noqa: E402

SEQ = 48
MODEL = dict(hf.CASES["llama_gqa_scaled"], layers=2, vocab_size=256, seq_len=SEQ)

REQUESTS = [
    {"context": "The cat sat on the", "choices": [" mat", " hat", " moon and the stars"], "gold": 0},
    {"context": "Question: two plus two is ", "choices": ["four", "five", "4"], "gold": 2},
    # 70 bytes of context + a choice: more than seq_len + 1 tokens, cut from the left.
    {"context": "abcdefghij" * 7, "choices": [" klm", " xyz"], "gold": 1},
    {"context": "Q", "choices": [" a", " bb", " ccc", " dddd"], "gold": 3},
]
HELLASWAG = [
    {"activity_label": "Removing ice from car", "ctx_a": "Then, the man writes over the snow.",
     "ctx_b": "then, the man", "label": 3,
     "endings": [", the man continues removing the snow.", " puts on a [header] hat.",
                 " [title] waves  at the camera.", " drives away."]},
    {"activity_label": "Baking cookies", "ctx_a": "A woman mixes flour.", "ctx_b": "SHE",
     "label": "1", "endings": [" bakes.", " eats the dough [step] quickly.", " leaves."]},
]


# ---- the reference: lm-evaluation-harness's rules, written from its published code --------------

def hellaswag_preprocess(text):
    text = text.strip().replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    return text.replace("  ", " ")


def hellaswag_doc(doc):
    ctx = doc["ctx_a"] + " " + doc["ctx_b"].capitalize()
    choices = [hellaswag_preprocess(e) for e in doc["endings"]]
    return {"context": hellaswag_preprocess(doc["activity_label"] + ": " + ctx),
            "continuations": [" " + c for c in choices], "lengths": [len(c.encode()) for c in choices],
            "gold": int(doc["label"])}


def request_doc(doc):
    return {"context": doc["context"], "continuations": doc["choices"],
            "lengths": [len(c.encode()) for c in doc["choices"]], "gold": doc["gold"]}


def encode(text):  # the byte tokenizer
    return list(text.encode())


def loglikelihood(weights, config, context, continuation):
    n = len(context) - len(context.rstrip())
    if n:
        context, continuation = context[:-n], context[-n:] + continuation
    whole, ctx = encode(context + continuation), encode(context)
    cont = whole[len(ctx):]
    inp = (ctx + cont)[-(SEQ + 1):][:-1]
    logits = ref.decoder_logits(weights, config, np.array([inp]))[0][len(inp) - len(cont):]
    m = logits.max(axis=-1, keepdims=True)
    logp = logits - m - np.log(np.exp(logits - m).sum(axis=-1, keepdims=True))
    return float(sum(logp[i, t] for i, t in enumerate(cont)))


def reference_scores(weights, config, docs):
    lls = [[loglikelihood(weights, config, d["context"], c) for c in d["continuations"]] for d in docs]
    acc = sum(int(np.argmax(l)) == d["gold"] for l, d in zip(lls, docs))
    acc_norm = sum(int(np.argmax(np.array(l) / np.array(d["lengths"]))) == d["gold"] for l, d in zip(lls, docs))
    return lls, acc, acc_norm


# ---- the test ----------------------------------------------------------------------------------

class ChoiceScoringTest(harness.Case):
    def setUp(self):
        super().setUp()
        with open(self.deck, "w") as f:
            f.write(hf.deck_text(self.run_dir, MODEL))
        self.requests = os.path.join(self.dir, "requests.jsonl")
        self.hellaswag = os.path.join(self.dir, "hellaswag.jsonl")
        for path, rows in ((self.requests, REQUESTS), (self.hellaswag, HELLASWAG)):
            with open(path, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)

    def eval_tasks(self, ckpt, ranks, sets=()):
        """({task: per-example lists of sums}, {task: (correct, correct_norm, examples)})."""
        per_choice = os.path.join(self.dir, "per_choice.jsonl")
        args = ["eval", self.deck, "--checkpoint", ckpt, "--task", self.requests, "--task",
                self.hellaswag, "--per-choice", per_choice, "--set", 'train.precision="fp64"',
                "--set", 'data.val="none"']
        for s in sets:
            args += ["--set", s]
        _, out, _ = self.meshtrain(args, ranks=ranks)
        lls = {}
        with open(per_choice) as f:
            for line in f:
                r = json.loads(line)
                rows = lls.setdefault(r["task"], [])
                if r["choice"] == 0:
                    rows.append([])
                rows[r["example"]].append(r["loglikelihood"])
        scores = {m.group(1): (int(m.group(2)), int(m.group(4)), int(m.group(3)))
                  for m in re.finditer(r"^task (\S+): acc \S+ \((\d+)/(\d+)\) acc_norm \S+ \((\d+)/\d+\)$", out, re.M)}
        return lls, scores

    def assert_close(self, got, want, what):
        for e, (g, w) in enumerate(zip(got, want)):
            self.assertEqual(len(g), len(w), f"{what}: example {e}")
            for k, (a, b) in enumerate(zip(g, w)):
                self.assertLess(abs(a - b), 1e-9 * max(1.0, abs(b)), f"{what}: example {e} choice {k}: {a!r} vs {b!r}")

    def test_reference_and_layouts(self):
        config = hf.hf_config(MODEL)
        self.train(2, ["parallel.tp=2", "train.steps=2", "checkpoint.every=2"])
        ckpt = self.ckpt(2)
        weights = hf.random_hf_weights(config, seed=11)
        hf.write_hf_weights_into_checkpoint(ckpt, weights, config)
        docs = {"requests": [request_doc(d) for d in REQUESTS],
                "hellaswag": [hellaswag_doc(d) for d in HELLASWAG]}
        lls, scores = self.eval_tasks(ckpt, 1)
        for task, task_docs in docs.items():
            want, acc, acc_norm = reference_scores(weights, config, task_docs)
            print(f"\n{task}: reference acc {acc}/{len(task_docs)} acc_norm {acc_norm}; eval {scores[task]}")
            self.assert_close(lls[task], want, task)
            self.assertEqual(scores[task], (acc, acc_norm, len(task_docs)), task)
        for ranks, sets in ((2, ["parallel.tp=2"]), (2, ["parallel.pp=2"]), (2, ["parallel.dp=2"])):
            got, got_scores = self.eval_tasks(ckpt, ranks, sets)
            for task in docs:
                self.assert_close(got[task], lls[task], f"{task} on {sets}")
            self.assertEqual(got_scores, scores, sets)

    def test_train_eval_tasks(self):
        tasks = json.dumps([self.requests, self.hellaswag])
        _, out, _ = self.train(2, ["parallel.pp=2", "train.steps=4", "train.eval_every=2",
                                   "checkpoint.every=4", f"train.eval_tasks={tasks}"])
        lines = re.findall(r"^step +(\d+)/4 \| task (\S+): acc (\S+) acc_norm (\S+)", out, re.M)
        self.assertEqual(sorted({(int(s), t) for s, t, _, _ in lines}),
                         [(2, "hellaswag"), (2, "requests"), (4, "hellaswag"), (4, "requests")], out)
        with open(os.path.join(self.run_dir, "metrics.jsonl")) as f:
            records = [r for r in map(json.loads, f) if "task" in r]
        self.assertEqual(len(records), 4)
        _, scores = self.eval_tasks(self.ckpt(4), 1)
        for r in records:
            if r["step"] == 4:
                correct, correct_norm, n = scores[r["task"]]
                self.assertEqual((r["acc"], r["acc_norm"], r["examples"]), (correct / n, correct_norm / n, n))


if __name__ == "__main__":
    harness.main()
